//! The `Idempotency-Key` header value (SPEC S2).
//!
//! Two spellings name the same key: the Structured Field string of
//! draft-ietf-httpapi-idempotency-key-header (`"8e03978e-…"`) and the bare token
//! that Stripe clients send (`8e03978e-…`). A value whose first character is a
//! double quote is read as the quoted form; anything else as the bare form.

use std::fmt;

/// The longest key accepted, in characters (SPEC S2).
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 printable ASCII characters.
///
/// The stored form is the decoded key: `"abc"` and `abc` parse to the same `Key`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

/// Why a header value is not a valid idempotency key.
///
/// Every variant's message says what is wrong in terms a client developer can act on;
/// it is what the 400 problem body's `detail` carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The header is present but its value (or the quoted string) is empty.
    #[error("the Idempotency-Key header is empty; send 1 to 255 printable ASCII characters")]
    Empty,
    /// The key has more than [`MAX_KEY_LEN`] characters.
    #[error("the Idempotency-Key is {len} characters long; the limit is 255")]
    TooLong {
        /// Length of the decoded key.
        len: usize,
    },
    /// A byte outside printable ASCII (0x20–0x7E).
    #[error(
        "the Idempotency-Key has a byte 0x{byte:02x} at position {position}; only printable ASCII (0x20-0x7E) is allowed"
    )]
    BadCharacter {
        /// Zero-based byte offset in the header value.
        position: usize,
        /// The offending byte.
        byte: u8,
    },
    /// The value starts with `"` but is not a well-formed Structured Field string.
    #[error("the quoted Idempotency-Key is malformed: {reason}")]
    BadQuoting {
        /// What is wrong with the quoting.
        reason: &'static str,
    },
    /// More than one `Idempotency-Key` field on one request.
    #[error("the request carries {count} Idempotency-Key header fields; send exactly one")]
    Repeated {
        /// How many fields were present.
        count: usize,
    },
}

impl Key {
    /// Parses one header field value, in either the quoted or the bare form.
    ///
    /// Optional whitespace around the field value (spaces and tabs, RFC 9110 §5.5) is
    /// not part of the key.
    ///
    /// ```
    /// use idem_core::Key;
    /// let quoted = Key::parse(br#""8e03978e-40d5-43e8-bc93-6894a57f9324""#).unwrap();
    /// let bare = Key::parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap();
    /// assert_eq!(quoted, bare);
    /// ```
    pub fn parse(value: &[u8]) -> Result<Key, KeyError> {
        let start = value
            .iter()
            .position(|b| !matches!(b, b' ' | b'\t'))
            .unwrap_or(value.len());
        let end = value
            .iter()
            .rposition(|b| !matches!(b, b' ' | b'\t'))
            .map_or(start, |i| i + 1);
        let trimmed = &value[start..end];
        if trimmed.first() == Some(&b'"') {
            return parse_quoted(trimmed, start);
        }
        if trimmed.is_empty() {
            return Err(KeyError::Empty);
        }
        if let Some(i) = trimmed.iter().position(|b| !is_printable(*b)) {
            return Err(KeyError::BadCharacter {
                position: start + i,
                byte: trimmed[i],
            });
        }
        check_len(trimmed.len())?;
        // Every byte is ASCII, so this is valid UTF-8.
        Ok(Key(String::from_utf8_lossy(trimmed).into_owned()))
    }

    /// Parses all the `Idempotency-Key` field values of one request.
    ///
    /// Returns `Ok(None)` when there is none, the key when there is exactly one, and
    /// [`KeyError::Repeated`] when there are several (SPEC S2).
    pub fn from_fields<'a, I>(values: I) -> Result<Option<Key>, KeyError>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let mut iter = values.into_iter();
        let Some(first) = iter.next() else {
            return Ok(None);
        };
        let extra = iter.count();
        if extra > 0 {
            return Err(KeyError::Repeated { count: extra + 1 });
        }
        Key::parse(first).map(Some)
    }

    /// Builds a key from a string, validating it like the bare form but accepting any
    /// printable ASCII, including a leading `"` or surrounding spaces.
    pub fn new(key: impl Into<String>) -> Result<Key, KeyError> {
        let key = key.into();
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if let Some(i) = key.bytes().position(|b| !is_printable(b)) {
            return Err(KeyError::BadCharacter {
                position: i,
                byte: key.as_bytes()[i],
            });
        }
        check_len(key.len())?;
        Ok(Key(key))
    }

    /// The decoded key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as a Structured Field string, quotes and escapes included.
    pub fn to_sf_string(&self) -> String {
        let mut out = String::with_capacity(self.0.len() + 2);
        out.push('"');
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }
}

fn parse_quoted(value: &[u8], offset: usize) -> Result<Key, KeyError> {
    let mut out = String::with_capacity(value.len());
    let mut i = 1;
    loop {
        let Some(&b) = value.get(i) else {
            return Err(KeyError::BadQuoting {
                reason: "missing closing double quote",
            });
        };
        match b {
            b'"' => {
                if i + 1 != value.len() {
                    return Err(KeyError::BadQuoting {
                        reason: "characters after the closing double quote",
                    });
                }
                break;
            }
            b'\\' => {
                match value.get(i + 1) {
                    Some(&e @ (b'"' | b'\\')) => out.push(e as char),
                    Some(_) => {
                        return Err(KeyError::BadQuoting {
                            reason: "only \\\" and \\\\ escapes are allowed",
                        });
                    }
                    None => {
                        return Err(KeyError::BadQuoting {
                            reason: "missing closing double quote",
                        });
                    }
                }
                i += 2;
                continue;
            }
            b if is_printable(b) => out.push(b as char),
            byte => {
                return Err(KeyError::BadCharacter {
                    position: offset + i,
                    byte,
                });
            }
        }
        i += 1;
    }
    if out.is_empty() {
        return Err(KeyError::Empty);
    }
    check_len(out.len())?;
    Ok(Key(out))
}

fn check_len(len: usize) -> Result<(), KeyError> {
    if len > MAX_KEY_LEN {
        Err(KeyError::TooLong { len })
    } else {
        Ok(())
    }
}

fn is_printable(b: u8) -> bool {
    (0x20..=0x7e).contains(&b)
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys are opaque client labels; show them in full for debugging only.
        f.debug_tuple("Key").field(&self.0).finish()
    }
}

impl std::str::FromStr for Key {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Key, KeyError> {
        Key::parse(s.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_and_bare_name_the_same_key() {
        let a = Key::parse(br#""8e03978e-40d5-43e8-bc93-6894a57f9324""#).unwrap();
        let b = Key::parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.as_str(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
    }

    #[test]
    fn surrounding_whitespace_is_not_part_of_the_key() {
        assert_eq!(Key::parse(b"  abc\t").unwrap().as_str(), "abc");
        assert_eq!(Key::parse(b" \" a b \" ").unwrap().as_str(), " a b ");
    }

    #[test]
    fn escapes_decode() {
        assert_eq!(Key::parse(br#""a\"b\\c""#).unwrap().as_str(), r#"a"b\c"#);
    }

    #[test]
    fn empty_is_rejected() {
        assert_eq!(Key::parse(b""), Err(KeyError::Empty));
        assert_eq!(Key::parse(b"   "), Err(KeyError::Empty));
        assert_eq!(Key::parse(b"\"\""), Err(KeyError::Empty));
    }

    #[test]
    fn length_limit_is_255() {
        assert!(Key::parse("a".repeat(255).as_bytes()).is_ok());
        assert_eq!(
            Key::parse("a".repeat(256).as_bytes()),
            Err(KeyError::TooLong { len: 256 })
        );
        let quoted = format!("\"{}\"", "b".repeat(255));
        assert!(Key::parse(quoted.as_bytes()).is_ok());
    }

    #[test]
    fn bad_characters_are_located() {
        assert_eq!(
            Key::parse(b"ab\x01c"),
            Err(KeyError::BadCharacter {
                position: 2,
                byte: 1
            })
        );
        assert_eq!(
            Key::parse("caf\u{e9}".as_bytes()),
            Err(KeyError::BadCharacter {
                position: 3,
                byte: 0xc3
            })
        );
        assert!(matches!(
            Key::parse(b"\"a\tb\""),
            Err(KeyError::BadCharacter { position: 2, .. })
        ));
    }

    #[test]
    fn bad_quoting_is_rejected() {
        for v in [&br#""abc"#[..], br#""a\nb""#, br#""abc"x"#, br#""abc\"#] {
            assert!(
                matches!(Key::parse(v), Err(KeyError::BadQuoting { .. })),
                "{:?}",
                String::from_utf8_lossy(v)
            );
        }
    }

    #[test]
    fn repeated_header_is_rejected() {
        let fields: [&[u8]; 2] = [b"a", b"a"];
        assert_eq!(
            Key::from_fields(fields),
            Err(KeyError::Repeated { count: 2 })
        );
        assert_eq!(Key::from_fields(std::iter::empty()), Ok(None));
        assert_eq!(
            Key::from_fields([&b"k"[..]]).unwrap().unwrap().as_str(),
            "k"
        );
    }

    #[test]
    fn sf_string_round_trips() {
        let k = Key::new(r#"a "quoted" \ key"#).unwrap();
        assert_eq!(Key::parse(k.to_sf_string().as_bytes()).unwrap(), k);
    }
}
