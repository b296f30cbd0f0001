//! libFuzzer harness for `idem_fuzz::path_normalize`: the properties live there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz::path_normalize(data));
