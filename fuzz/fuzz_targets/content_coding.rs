//! libFuzzer harness for `idem_fuzz::content_coding`: the properties live there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz::content_coding(data));
