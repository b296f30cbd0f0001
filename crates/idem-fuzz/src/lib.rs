//! Property functions for idem's fuzz targets.
//!
//! Each target is a `pub fn NAME(data: &[u8])` that reads the bytes as one input to the
//! code under test and panics when a property does not hold: a round trip that loses
//! something, an answer that contradicts another way of reaching it, an output larger
//! than its input allows. The libFuzzer harnesses in `fuzz/fuzz_targets/` call these
//! functions and nothing else, and `tests/corpus.rs` replays every input committed
//! under `fuzz/corpus/NAME/` through them, so `cargo test` guards every crash ever
//! found. `fuzz/README.md` says how to run the fuzzers and how to add a target.
//!
//! | target | code under test | properties |
//! |---|---|---|
//! | [`key_parse`] | `Key::parse`, `Key::from_fields` | SPEC S2's grammar, errors that point at the input, both spellings round-trip |
//! | [`fingerprint_json`] | the JSON canonical form behind `Fingerprint::compute` | accepted exactly when serde_json accepts, a fixed point, at most 5 times the input, same fingerprint as its canonical form |
//! | [`fingerprint_multipart`] | multipart parts behind `Fingerprint::compute` | parts lie in the body, another boundary gives the same fingerprint, a malformed body is hashed raw |
//! | [`content_coding`] | `Content-Encoding` undone in `idem-tower` | never more than the limit, stops one byte past it, content round-trips, fingerprint of the content |
//! | [`record_codec`] | `idem_core::codec` | what decodes encodes back to the same bytes, headers round-trip, truncation and trailing bytes refused |
//! | [`path_normalize`] | `idem_gateway`'s `path` | a normal path is normal again, absolute, free of dot segments and `//` as the options say, URI-safe, bounded |
//! | [`forwarded_parse`] | `idem_gateway`'s `forwarded` | whatever the client sent, the gateway's `Forwarded` and `X-Forwarded-For` parse and end with its own hop |

mod codec;
mod coding;
mod forwarded;
mod input;
mod json;
mod key;
mod multipart;
mod path;

pub use codec::record_codec;
pub use coding::content_coding;
pub use forwarded::forwarded_parse;
pub use json::fingerprint_json;
pub use key::key_parse;
pub use multipart::fingerprint_multipart;
pub use path::path_normalize;

/// A fuzz target: its name and its property function.
pub type Target = (&'static str, fn(&[u8]));

/// Every target. A name is also its harness (`fuzz/fuzz_targets/NAME.rs`, a `[[bin]]`
/// of `fuzz/Cargo.toml`) and its corpus directory (`fuzz/corpus/NAME/`); the corpus
/// test checks that all three exist for each entry here, and nothing more.
pub const TARGETS: &[Target] = &[
    ("key_parse", key_parse),
    ("fingerprint_json", fingerprint_json),
    ("fingerprint_multipart", fingerprint_multipart),
    ("content_coding", content_coding),
    ("record_codec", record_codec),
    ("path_normalize", path_normalize),
    ("forwarded_parse", forwarded_parse),
];
