//! libFuzzer harness for `idem_fuzz::record_codec`: the properties live there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz::record_codec(data));
