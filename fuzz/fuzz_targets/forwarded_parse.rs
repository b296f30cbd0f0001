//! libFuzzer harness for `idem_fuzz::forwarded_parse`: the properties live there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_fuzz::forwarded_parse(data));
