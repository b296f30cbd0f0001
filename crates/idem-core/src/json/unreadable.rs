//! The limits of what idem reads as JSON, and why it does not read a body
//! ([`UnreadableJson`]); the parser (`canonical.rs`) and the writers refuse by them.

/// The most arrays and objects nested in one another that idem reads as JSON: 10 000,
/// as Go's `encoding/json` allows. A deeper body is [`UnreadableJson::TooDeep`].
pub const MAX_JSON_DEPTH: usize = 10_000;

/// The most significant digits a number's exponent may have (12): `1e999999999999` is
/// read, `1e9999999999999` is [`UnreadableJson::LongExponent`].
pub const MAX_EXPONENT_DIGITS: usize = 12;

/// Why idem does not read a body as JSON, with the offset of the byte where it stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnreadableJson {
    /// Not JSON's grammar (RFC 8259): a stray byte, a missing one, trailing data.
    #[error("it is not JSON (at byte {at})")]
    Syntax {
        /// Where the parser stopped.
        at: usize,
    },
    /// A byte in a string that is not UTF-8.
    #[error("byte {at} is not UTF-8")]
    InvalidUtf8 {
        /// The first byte that is not.
        at: usize,
    },
    /// A `\u` escape of half a surrogate pair without its other half (`"\ud800"`).
    #[error("the escape at byte {at} is half of a surrogate pair without its other half")]
    LoneSurrogate {
        /// The escape's backslash.
        at: usize,
    },
    /// Arrays and objects nested deeper than [`MAX_JSON_DEPTH`].
    #[error("arrays and objects nest deeper than {MAX_JSON_DEPTH} levels (at byte {at})")]
    TooDeep {
        /// The bracket that opens one level too many.
        at: usize,
    },
    /// A number whose exponent has more than [`MAX_EXPONENT_DIGITS`] significant digits.
    #[error("the number at byte {at} has an exponent of more than {MAX_EXPONENT_DIGITS} digits")]
    LongExponent {
        /// The number's first byte.
        at: usize,
    },
    /// A number beyond a double's range, where the body is compared by its JCS form
    /// ([`FingerprintOptions::jcs`](crate::FingerprintOptions::jcs)), which has no
    /// spelling for it.
    #[error("the number at byte {at} is beyond a double's range, which JCS cannot write")]
    BeyondDouble {
        /// The number's first byte.
        at: usize,
    },
}

impl UnreadableJson {
    /// The offset of the byte where reading stopped.
    pub fn offset(&self) -> usize {
        match *self {
            UnreadableJson::Syntax { at }
            | UnreadableJson::InvalidUtf8 { at }
            | UnreadableJson::LoneSurrogate { at }
            | UnreadableJson::TooDeep { at }
            | UnreadableJson::LongExponent { at }
            | UnreadableJson::BeyondDouble { at } => at,
        }
    }
}
