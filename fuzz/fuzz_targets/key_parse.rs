//! libFuzzer harness for `idem_fuzz::key_parse`: the properties live there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz::key_parse(data));
