//! The request fingerprint (SPEC S4): what tells a retry from a different request that
//! reuses a key.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::json::{PointerError, UnreadableJson, is_blank, parse_pointer};
use crate::multipart;

/// The default limit on a buffered request body: 1 MiB (SPEC S4).
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// SHA-256 over method, endpoint and (normalised) body.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// How bodies are fingerprinted.
#[derive(Debug, Clone, Default)]
pub struct FingerprintOptions {
    pub(crate) ignored: Vec<Vec<String>>,
    pub(crate) jcs: bool,
}

impl FingerprintOptions {
    /// Leaves the value at a JSON pointer (RFC 6901, e.g. `/client_sent_at`) out of the
    /// fingerprint of JSON bodies. A pointer that does not resolve is ignored.
    ///
    /// Returns an error when the pointer is not of RFC 6901's form.
    pub fn ignore_pointer(mut self, pointer: &str) -> Result<Self, PointerError> {
        self.ignored.push(parse_pointer(pointer)?);
        Ok(self)
    }

    /// Whether any pointer is ignored.
    pub fn ignores_anything(&self) -> bool {
        !self.ignored.is_empty()
    }

    /// Whether these options read a JSON body's fields (they ignore a pointer, or
    /// compare by JCS): then [`Fingerprint::compute_checked`] refuses a JSON body it
    /// cannot read rather than hashing its bytes, which would leave out nothing and
    /// compare by nothing that was asked for.
    pub fn reads_fields(&self) -> bool {
        self.jcs || self.ignores_anything()
    }

    /// Compares JSON bodies by their RFC 8785 (JCS) canonical form, as a protocol that
    /// signs or hashes JSON that way asks (AdCP): every number read as an IEEE 754
    /// double and written as ECMAScript writes it (`1E30` is `1e+30`, `4.50` is `4.5`),
    /// members sorted by their names' UTF-16 code units, strings with JSON's minimal
    /// escapes. Unlike the default form, numbers beyond a double's precision compare
    /// as the double they round to (`0.1` and `0.10000000000000000001` match), as JCS
    /// says; a number beyond a double's range makes the body raw bytes.
    pub fn jcs(mut self) -> Self {
        self.jcs = true;
        self
    }

    /// Whether JSON bodies are compared by their JCS form ([`FingerprintOptions::jcs`]).
    pub fn is_jcs(&self) -> bool {
        self.jcs
    }
}

/// A JSON body names a member twice in one object (RFC 7493 §2.3 forbids it): see
/// [`Fingerprint::compute_checked`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the JSON body names the member {name:?} twice in one object")]
pub struct DuplicateMember {
    name: String,
}

impl DuplicateMember {
    /// The repeated name, unescaped (the first one found, where several repeat).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Why [`Fingerprint::compute_checked`] refuses a JSON body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefusedJson {
    /// It names a member twice in one object.
    #[error(transparent)]
    DuplicateMember(#[from] DuplicateMember),
    /// It cannot be read as JSON, where the options read its fields
    /// ([`FingerprintOptions::reads_fields`]).
    #[error("the JSON body cannot be read: {0}")]
    Unreadable(#[from] UnreadableJson),
}

impl Fingerprint {
    /// Fingerprints a request.
    ///
    /// `content_type` decides how the body is read: a JSON media type
    /// (`application/json`, `application/*+json`) that parses is normalised — object
    /// keys sorted, insignificant whitespace dropped, ignored pointers removed — so that
    /// semantically equal JSON fingerprints equal. Numbers compare by their exact
    /// decimal value, every digit counted (`1`, `1.0` and `10e-1` match;
    /// `12345678901234567890123` and `12345678901234567890124` do not), except that an
    /// integer of 10^19 or more matches only numbers spelled the same way (with or
    /// without a fraction or exponent). An object whose keys repeat keeps every entry,
    /// in order: `{"a":1,"a":2}` does not match `{"a":2}`. An
    /// `application/x-www-form-urlencoded` body is hashed as its parameters,
    /// percent-decoded and ordered by name (parameters of one name in the order sent),
    /// so `amount=100&currency=eur` matches `currency=eur&amount=%31%30%30`, as Stripe
    /// compares a retry's parameters. A `multipart/*` body is
    /// hashed as its parts (each one's headers and content, as sent) without the
    /// boundary, which clients choose at random for every attempt. Any other body, and
    /// form or multipart that does not parse (a form with a stray `%`), is hashed as raw
    /// bytes; so is JSON that idem does not read (see [`UnreadableJson`]: nesting past
    /// [`MAX_JSON_DEPTH`](crate::MAX_JSON_DEPTH), a lone surrogate escape, a byte that is
    /// not UTF-8), and a blank body. [`Fingerprint::compute_checked`] refuses such JSON
    /// instead where the options read its fields.
    ///
    /// ```
    /// use idem_core::{Fingerprint, FingerprintOptions};
    /// let opts = FingerprintOptions::default();
    /// let a = Fingerprint::compute("POST", "POST /v1/charges", Some("application/json"),
    ///     br#"{"amount": 100, "currency": "eur"}"#, &opts);
    /// let b = Fingerprint::compute("POST", "POST /v1/charges", Some("application/json"),
    ///     br#"{"currency":"eur","amount":100}"#, &opts);
    /// assert_eq!(a, b);
    /// ```
    pub fn compute(
        method: &str,
        endpoint: &str,
        content_type: Option<&str>,
        body: &[u8],
        options: &FingerprintOptions,
    ) -> Fingerprint {
        match Fingerprint::hash(method, endpoint, content_type, body, options, false) {
            Ok((fingerprint, _)) => fingerprint,
            Err(_) => unreachable!("a body idem cannot read is hashed as raw bytes"),
        }
    }

    /// [`Fingerprint::compute`], refusing a JSON body that a service may read otherwise
    /// than the fingerprint did. A caller that forwards the body refuses it too:
    ///
    /// - [`RefusedJson::DuplicateMember`]: the body names a member twice in one object
    ///   (`{"amount":100,"amount":1}`, at any depth, names compared after unescaping).
    ///   RFC 7493 (I-JSON) forbids such a text because parsers disagree on which member
    ///   counts, so a service may act on another payload than the one fingerprinted.
    /// - [`RefusedJson::Unreadable`]: the options read the body's fields
    ///   ([`FingerprintOptions::reads_fields`]: an ignored pointer, JCS) and idem cannot
    ///   read it as JSON. Its bytes would be hashed with nothing left out, so a retry
    ///   that changes an ignored field would be another request, while a service whose
    ///   parser reads the body acts on it. A blank body is hashed as its bytes: it has
    ///   no field to leave out. With options that read no field, such a body is hashed
    ///   as raw bytes, as [`Fingerprint::compute`] does.
    ///
    /// The body is parsed once for all of it.
    ///
    /// ```
    /// use idem_core::{Fingerprint, FingerprintOptions, RefusedJson, UnreadableJson};
    /// let opts = FingerprintOptions::default();
    /// let json = Some("application/json");
    /// let check = |body: &[u8], opts: &FingerprintOptions| {
    ///     Fingerprint::compute_checked("POST", "POST /v1/charges", json, body, opts)
    /// };
    /// let Err(RefusedJson::DuplicateMember(repeated)) =
    ///     check(br#"{"amount": 100, "amount": 1}"#, &opts) else { panic!() };
    /// assert_eq!(repeated.name(), "amount");
    /// assert!(check(br#"{"amount": 100}"#, &opts).is_ok());
    /// // Where a pointer is left out, a body idem cannot read is refused, not hashed.
    /// let lone = br#"{"sent_at": 1, "note": "\ud800"}"#;
    /// let ignoring = opts.clone().ignore_pointer("/sent_at").unwrap();
    /// assert_eq!(check(lone, &ignoring),
    ///     Err(RefusedJson::Unreadable(UnreadableJson::LoneSurrogate { at: 24 })));
    /// assert!(check(lone, &opts).is_ok());
    /// ```
    pub fn compute_checked(
        method: &str,
        endpoint: &str,
        content_type: Option<&str>,
        body: &[u8],
        options: &FingerprintOptions,
    ) -> Result<Fingerprint, RefusedJson> {
        let refuse = options.reads_fields();
        match Fingerprint::hash(method, endpoint, content_type, body, options, refuse)? {
            (fingerprint, None) => Ok(fingerprint),
            (_, Some(name)) => Err(DuplicateMember { name }.into()),
        }
    }

    /// The fingerprint, and the name a JSON body repeats within an object; a JSON body
    /// idem cannot read is hashed as raw bytes, or with `refuse`, `Err`.
    fn hash(
        method: &str,
        endpoint: &str,
        content_type: Option<&str>,
        body: &[u8],
        options: &FingerprintOptions,
        refuse: bool,
    ) -> Result<(Fingerprint, Option<String>), UnreadableJson> {
        let mut h = Sha256::new();
        for part in [method.as_bytes(), endpoint.as_bytes()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        let essence = content_type.map(essence).unwrap_or_default();
        let mut canonical = Vec::new();
        let mut duplicate = None;
        let json = is_json(&essence) && !is_blank(body) && {
            canonical.reserve(body.len());
            let read = if options.jcs {
                crate::jcs::canonicalize(body, &options.ignored, &mut canonical)
            } else {
                crate::canonical::canonicalize(body, &options.ignored, &mut canonical)
            };
            match read {
                Ok(found) => {
                    duplicate = found;
                    true
                }
                Err(e) if refuse => return Err(e),
                Err(_) => false,
            }
        };
        let parts = || {
            let boundary = multipart::boundary(content_type?)?;
            multipart::parts(body, boundary)
        };
        if json {
            h.update(if options.jcs { &b"jcs"[..] } else { b"json" });
            h.update(&canonical);
        } else if let Some(params) = (essence == FORM)
            .then(|| crate::form::params(body))
            .flatten()
        {
            h.update(b"form");
            for p in params {
                h.update((p.name.len() as u64).to_be_bytes());
                h.update(&p.name);
                match p.value {
                    None => h.update([0]),
                    Some(value) => {
                        h.update([1]);
                        h.update((value.len() as u64).to_be_bytes());
                        h.update(&value);
                    }
                }
            }
        } else if let Some(parts) = essence.starts_with("multipart/").then(parts).flatten() {
            h.update(b"multipart");
            let fields = parts.iter().flat_map(|p| [p.headers, p.content]);
            for field in std::iter::once(essence.as_bytes()).chain(fields) {
                h.update((field.len() as u64).to_be_bytes());
                h.update(field);
            }
        } else {
            h.update(b"raw");
            h.update(body);
        }
        Ok((Fingerprint(h.finalize().into()), duplicate))
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint from stored bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// A fingerprint from a stored byte slice; `None` unless it is 32 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Fingerprint> {
        bytes.try_into().ok().map(Fingerprint)
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

/// The media type of a form body.
const FORM: &str = "application/x-www-form-urlencoded";

/// The media type without parameters, in lower case (`application/json`).
fn essence(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn is_json(essence: &str) -> bool {
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Whether `content_type` names JSON (`application/json`, `application/*+json`, any
/// case, any parameters): the bodies [`Fingerprint::compute`] reads as JSON.
///
/// ```
/// assert!(idem_core::is_json_content_type("application/vnd.api+json; charset=utf-8"));
/// assert!(!idem_core::is_json_content_type("text/plain"));
/// ```
pub fn is_json_content_type(content_type: &str) -> bool {
    is_json(&essence(content_type))
}

#[cfg(test)]
mod tests;
