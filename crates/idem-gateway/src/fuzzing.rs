//! Entry points for idem's fuzz targets (`fuzz/` in the repository): how the gateway
//! spells a request path, and how it reads a client's `Forwarded` and
//! `X-Forwarded-For` and adds its own hop.
//!
//! Not part of the supported API: compiled only with the `fuzzing` feature, hidden from
//! the docs, and free to change in any release.

/// A client's `Forwarded` and `X-Forwarded-For` values, read, and the gateway's own hop
/// added to them.
pub mod forwarded {
    pub use crate::forwarded::{add_forwarded, is_valid, parse, x_forwarded_for_is_valid};
}

/// The spelling of a request path (SPEC S14).
pub mod path {
    pub use crate::path::{PathNormalization, normalize};
}
