//! The request fingerprint (SPEC S4): what tells a retry from a different request that
//! reuses a key.

use std::fmt;
use std::io::Write as _;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The default limit on a buffered request body: 1 MiB (SPEC S4).
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// SHA-256 over method, endpoint and (normalised) body.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// How bodies are fingerprinted.
#[derive(Debug, Clone, Default)]
pub struct FingerprintOptions {
    ignored: Vec<Vec<String>>,
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
}

/// A JSON pointer that is not of RFC 6901's form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON pointer {pointer:?}: {reason}")]
pub struct PointerError {
    pointer: String,
    reason: &'static str,
}

fn parse_pointer(pointer: &str) -> Result<Vec<String>, PointerError> {
    let err = |reason| PointerError {
        pointer: pointer.to_owned(),
        reason,
    };
    if pointer.is_empty() {
        return Err(err(
            "the empty pointer names the whole body; it cannot be ignored",
        ));
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(err("a pointer starts with '/'"));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => out.push('~'),
                        Some('1') => out.push('/'),
                        _ => return Err(err("'~' must be followed by '0' or '1'")),
                    }
                } else {
                    out.push(c);
                }
            }
            Ok(out)
        })
        .collect()
}

impl Fingerprint {
    /// Fingerprints a request.
    ///
    /// `content_type` decides how the body is read: a JSON media type
    /// (`application/json`, `application/*+json`) that parses is normalised — object
    /// keys sorted, insignificant whitespace dropped, ignored pointers removed — so that
    /// semantically equal JSON fingerprints equal. Numbers compare by value as IEEE-754
    /// doubles (integers are exact up to 2^64). Any other body, and JSON that does not
    /// parse, is hashed as raw bytes.
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
        let mut h = Sha256::new();
        for part in [method.as_bytes(), endpoint.as_bytes()] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        let normalised = content_type
            .filter(|ct| is_json(ct))
            .and_then(|_| serde_json::from_slice::<Value>(body).ok())
            .map(|mut value| {
                for pointer in &options.ignored {
                    remove_pointer(&mut value, pointer);
                }
                let mut out = Vec::with_capacity(body.len());
                write_canonical(&value, &mut out);
                out
            });
        match normalised {
            Some(canonical) => {
                h.update(b"json");
                h.update(&canonical);
            }
            None => {
                h.update(b"raw");
                h.update(body);
            }
        }
        Fingerprint(h.finalize().into())
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

fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

fn remove_pointer(value: &mut Value, pointer: &[String]) {
    let Some((last, parents)) = pointer.split_last() else {
        return;
    };
    let mut cur = value;
    for token in parents {
        cur = match cur {
            Value::Object(map) => match map.get_mut(token) {
                Some(v) => v,
                None => return,
            },
            Value::Array(items) => match token.parse::<usize>().ok().and_then(|i| items.get_mut(i))
            {
                Some(v) => v,
                None => return,
            },
            _ => return,
        };
    }
    match cur {
        Value::Object(map) => {
            map.remove(last);
        }
        Value::Array(items) => {
            if let Some(i) = last.parse::<usize>().ok().filter(|i| *i < items.len()) {
                items.remove(i);
            }
        }
        _ => {}
    }
}

/// Writes `value` with object keys sorted by their UTF-8 bytes and no whitespace. Keys
/// are sorted here rather than relying on `serde_json::Map`'s order, which another crate
/// in the build may switch to insertion order.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_canonical(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        Value::String(s) => write_string(s, out),
        Value::Number(n) => {
            // One spelling per value: 1, 1.0 and 1e0 all become the same bytes. Written
            // in place (`Display` into the buffer), not through a `String` each.
            match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => write!(out, "{u}"),
                (None, Some(i), _) => write!(out, "{i}"),
                (None, None, Some(f)) if f.fract() == 0.0 && f.abs() < 1e19 => {
                    write!(out, "{f:.0}")
                }
                (None, None, Some(f)) => write!(out, "{f:e}"),
                _ => write!(out, "{n}"),
            }
            .expect("writing to a Vec")
        }
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Null => out.extend_from_slice(b"null"),
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json's string escaping is canonical (one spelling per string), and its
    // writer appends to the buffer without a `String` of its own.
    serde_json::to_writer(&mut *out, s).expect("a string always serialises");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(ct: Option<&str>, body: &[u8], opts: &FingerprintOptions) -> Fingerprint {
        Fingerprint::compute("POST", "POST /v1/charges", ct, body, opts)
    }

    const JSON: Option<&str> = Some("application/json; charset=utf-8");

    #[test]
    fn reordered_keys_and_whitespace_match() {
        let o = FingerprintOptions::default();
        assert_eq!(
            fp(JSON, br#"{"a":1,"b":{"y":[1,2],"x":null}}"#, &o),
            fp(
                JSON,
                b"{ \"b\" : {\"x\":null, \"y\":[1, 2]},\n\"a\":1 }",
                &o
            )
        );
    }

    #[test]
    fn number_spellings_match_but_values_differ() {
        let o = FingerprintOptions::default();
        assert_eq!(fp(JSON, br#"{"a":1}"#, &o), fp(JSON, br#"{"a":1.0}"#, &o));
        assert_eq!(fp(JSON, br#"{"a":100}"#, &o), fp(JSON, br#"{"a":1e2}"#, &o));
        assert_ne!(fp(JSON, br#"{"a":100}"#, &o), fp(JSON, br#"{"a":101}"#, &o));
        assert_ne!(fp(JSON, br#"{"a":"1"}"#, &o), fp(JSON, br#"{"a":1}"#, &o));
    }

    #[test]
    fn changed_amount_differs() {
        let o = FingerprintOptions::default();
        assert_ne!(
            fp(JSON, br#"{"amount":100}"#, &o),
            fp(JSON, br#"{"amount":1000}"#, &o)
        );
    }

    #[test]
    fn non_json_is_raw_bytes() {
        let o = FingerprintOptions::default();
        let form = Some("application/x-www-form-urlencoded");
        assert_ne!(fp(form, b"a=1&b=2", &o), fp(form, b"b=2&a=1", &o));
        // JSON content under another media type is not normalised.
        assert_ne!(
            fp(Some("text/plain"), br#"{"a":1}"#, &o),
            fp(Some("text/plain"), br#"{ "a":1}"#, &o)
        );
        // Unparseable JSON falls back to bytes rather than failing.
        assert_ne!(fp(JSON, b"{bad", &o), fp(JSON, b"{bad ", &o));
    }

    #[test]
    fn method_and_endpoint_are_part_of_it() {
        let o = FingerprintOptions::default();
        let a = Fingerprint::compute("POST", "POST /a", JSON, b"{}", &o);
        let b = Fingerprint::compute("POST", "POST /b", JSON, b"{}", &o);
        let c = Fingerprint::compute("PATCH", "POST /a", JSON, b"{}", &o);
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn ignored_pointers_are_left_out() {
        let o = FingerprintOptions::default()
            .ignore_pointer("/client_sent_at")
            .unwrap()
            .ignore_pointer("/meta/trace~1id")
            .unwrap()
            .ignore_pointer("/items/0/nonce")
            .unwrap();
        assert_eq!(
            fp(
                JSON,
                br#"{"amount":1,"client_sent_at":"t1","meta":{"trace/id":"x","k":1},"items":[{"nonce":1,"v":2}]}"#,
                &o
            ),
            fp(
                JSON,
                br#"{"amount":1,"client_sent_at":"t2","meta":{"trace/id":"y","k":1},"items":[{"nonce":9,"v":2}]}"#,
                &o
            )
        );
        assert_ne!(
            fp(JSON, br#"{"amount":1,"client_sent_at":"t"}"#, &o),
            fp(JSON, br#"{"amount":2,"client_sent_at":"t"}"#, &o)
        );
    }

    #[test]
    fn bad_pointers_are_rejected() {
        let o = FingerprintOptions::default();
        assert!(o.clone().ignore_pointer("").is_err());
        assert!(o.clone().ignore_pointer("a").is_err());
        assert!(o.ignore_pointer("/a~2").is_err());
    }

    #[test]
    fn vendor_json_types_are_normalised() {
        let o = FingerprintOptions::default();
        let ct = Some("application/vnd.api+json");
        assert_eq!(
            fp(ct, br#"{"a":1,"b":2}"#, &o),
            fp(ct, br#"{"b":2,"a":1}"#, &o)
        );
    }

    /// Stored fingerprints must not change between releases: a retry after an upgrade
    /// would meet its own record as a different request (422). These digests are
    /// what idem has computed for these inputs from the start; a change to the canonical
    /// form breaks them.
    #[test]
    fn digests_are_stable_across_releases() {
        let o = FingerprintOptions::default();
        let cases: [(Option<&str>, &[u8], &str); 8] = [
            (
                JSON,
                br#"{"amount":100,"currency":"eur","customer":"cus_123"}"#,
                "d29063679644c90bd31f8c9f3cd6b6451c6c1a011db8d726689eda00c87d3e52",
            ),
            (
                JSON,
                br#"{"z":[1,-2,3.5,1e2,-0.25e-3,18446744073709551615,-9223372036854775808],"a":{"y":null,"x":[true,false]}}"#,
                "85e7338ccb8a7d6e978255da0efd90ef23f12f22624c76f5e6d50a9e37d29f52",
            ),
            (
                JSON,
                "{\"s\":\"q\\\"b\\\\s\\/ \\u0001\\t\\n é \\ud83d\\ude00 \\u00e9\"}".as_bytes(),
                "9ccb817ee8080224fffd4596d2ba616b259d1c801e9ef3051b560fbccd821082",
            ),
            (
                JSON,
                br#"[1e300,2.5e-300,1e19,123456789012345678901234567890,0.1]"#,
                "e8a896c7ebb63ffe47ad283ee1846aa121fb928d1b7f4f4811b38481219ff535",
            ),
            (
                JSON,
                br#"{"dup":1,"dup":2}"#,
                "4ea8822db152191e9c411a1cc936b4d60848435f45c6e1a8b97b2e3419ee4fae",
            ),
            (
                JSON,
                br#""just a string""#,
                "deda447e42ced7f4c92c9c5230674b1056f1239e241af6f5ee419b494ad48561",
            ),
            (
                Some("text/plain"),
                b"amount=100&currency=eur",
                "c9308a41cf7f7eb419cc3962d8871ddc67600c9dc2f3e3006a14ed51cf4ec118",
            ),
            (
                JSON,
                b"{not json",
                "121988106f150b4b10bbb857df33f96a6400c8d8e76b1f3c9bd48fc6a34d1b53",
            ),
        ];
        for (ct, body, want) in cases {
            assert_eq!(
                fp(ct, body, &o).to_hex(),
                want,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
