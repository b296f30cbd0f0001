//! libFuzzer harness for `idem_fuzz::fingerprint_json`: the properties live there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz::fingerprint_json(data));
