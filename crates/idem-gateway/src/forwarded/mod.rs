//! A request's `Forwarded` (RFC 7239) and `X-Forwarded-*` headers: what a client sent,
//! read, and the gateway's own hop added to it ([`add_forwarded`]) only where it parses.
//!
//! The proxy appends `, for=…;proto=http;host="…"` to what the client sent. Appended
//! to a value that does not parse, the gateway's element can end up inside the
//! client's text: after `for="6.6.6.6` (an open quote) the gateway's element is part
//! of the client's quoted-string, and an upstream that reads the last element reads
//! the client's choice instead of the gateway's. So the proxy keeps a client's value
//! only when [`parse`] (or [`x_forwarded_for_is_valid`]) accepts it, and otherwise
//! drops it, with a debug log line, before adding its own.
//!
//! What parses, for `Forwarded` (RFC 7239 §4, with the list rule of RFC 9110 §5.6.1):
//!
//! - a comma-separated list of elements; optional whitespace around the commas; empty
//!   list elements (`a=1, , b=2`) are skipped, as RFC 9110 tells recipients to, but at
//!   least one element must hold a pair;
//! - an element is `;`-separated `token=value` pairs (empty pairs, as in `for=a;;by=b`,
//!   are skipped too; whitespace around a `;` is tolerated, never around the `=`);
//! - a value is a token or a quoted-string (`"…"`, with `\` escaping the next
//!   character; an unterminated one, or one ending in a lone `\`, does not parse); `:`
//!   and `[` are no token characters, so an address with a port and an IPv6 address
//!   are quoted (`for="[2001:db8::1]:4711"`), as RFC 7239 §6 says;
//! - a parameter name occurs at most once per element, ignoring case (RFC 7239 §4):
//!   `for=a;for=b` would let two parsers of the same header disagree about the client.
//!
//! Several `Forwarded` fields are one list joined with `", "` (RFC 9110 §5.3); the
//! proxy keeps them, so joined, only if the whole list parses.
//!
//! `X-Forwarded-For` has no specification; the rule is the same in spirit: a
//! comma-separated list (empty elements skipped, at least one not) whose every entry
//! is an IP address (`203.0.113.7`, `2001:db8::1`, `[2001:db8::1]`), one with a port
//! (`203.0.113.7:4711`, `[2001:db8::1]:4711`), `unknown`, or an obfuscated identifier
//! as RFC 7239 §6.3 defines them (`_` then letters, digits, `.`, `_`, `-`).

use std::net::{IpAddr, SocketAddr};

mod hop;

pub use hop::add_forwarded;

/// One `name=value` pair of a forwarded element, as sent: `name` in the case it came in,
/// `value` with a quoted-string's quotes removed and its escapes resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The parameter's name (`for`, `by`, `proto`, `host`, or an extension).
    pub(crate) name: String,
    /// Its value, unquoted.
    pub(crate) value: String,
}

/// One element of a `Forwarded` list: the pairs one hop added.
pub type Element = Vec<Pair>;

/// Why a `Forwarded` value does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("byte {at}: {what}")]
pub struct ParseError {
    /// The offset, in bytes, where parsing stopped.
    pub(crate) at: usize,
    /// What was expected there.
    pub(crate) what: &'static str,
}

/// Parses a `Forwarded` field value (or several joined with `", "`) into its elements,
/// empty ones left out; the module's docs give the grammar.
pub fn parse(value: &str) -> Result<Vec<Element>, ParseError> {
    let mut p = Parser {
        s: value.as_bytes(),
        at: 0,
    };
    let mut elements = Vec::new();
    loop {
        p.skip_ows();
        let element = p.element()?;
        if !element.is_empty() {
            elements.push(element);
        }
        p.skip_ows();
        match p.peek() {
            None => break,
            Some(b',') => p.at += 1,
            Some(_) => return Err(p.error("a comma between elements")),
        }
    }
    if elements.is_empty() {
        return Err(ParseError {
            at: 0,
            what: "at least one name=value pair",
        });
    }
    Ok(elements)
}

/// Whether `value` parses as a `Forwarded` field value ([`parse`]).
pub fn is_valid(value: &str) -> bool {
    parse(value).is_ok()
}

/// Whether `value` is an `X-Forwarded-For` list the proxy may append to, by the rule
/// the module's docs give.
pub fn x_forwarded_for_is_valid(value: &str) -> bool {
    let mut entries = x_forwarded_for_entries(value).peekable();
    entries.peek().is_some() && entries.all(is_node)
}

/// The entries of an `X-Forwarded-For` value, trimmed, empty ones skipped.
pub(crate) fn x_forwarded_for_entries(value: &str) -> impl DoubleEndedIterator<Item = &str> {
    value
        .split(',')
        .map(|e| e.trim_matches([' ', '\t']))
        .filter(|e| !e.is_empty())
}

fn is_node(entry: &str) -> bool {
    if entry.eq_ignore_ascii_case("unknown") {
        return true;
    }
    if let Some(rest) = entry.strip_prefix('_') {
        return !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    }
    node_address(entry).is_some()
}

/// The address in an `X-Forwarded-For` entry: an IP address, one with a port, or an
/// IPv6 address in brackets; `None` for `unknown`, an obfuscated identifier or
/// anything else.
pub(crate) fn node_address(entry: &str) -> Option<IpAddr> {
    if let Some(inner) = entry.strip_prefix('[').and_then(|e| e.strip_suffix(']')) {
        return inner.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6);
    }
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|a| a.ip()))
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn error(&self, what: &'static str) -> ParseError {
        ParseError { at: self.at, what }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }

    /// Pairs up to the next `,` or the end; empty pairs skipped.
    fn element(&mut self) -> Result<Element, ParseError> {
        let mut pairs: Element = Vec::new();
        loop {
            self.skip_ows();
            if matches!(self.peek(), None | Some(b',' | b';')) {
                // An empty pair.
            } else {
                let start = self.at;
                let pair = self.pair()?;
                if pairs
                    .iter()
                    .any(|p| p.name.eq_ignore_ascii_case(&pair.name))
                {
                    return Err(ParseError {
                        at: start,
                        what: "each parameter at most once per element",
                    });
                }
                pairs.push(pair);
                self.skip_ows();
            }
            match self.peek() {
                Some(b';') => self.at += 1,
                None | Some(b',') => return Ok(pairs),
                Some(_) => return Err(self.error("a ';' or ',' after a pair")),
            }
        }
    }

    fn pair(&mut self) -> Result<Pair, ParseError> {
        let name = self.token().ok_or_else(|| self.error("a parameter name"))?;
        if self.peek() != Some(b'=') {
            return Err(self.error("'=' right after the parameter name"));
        }
        self.at += 1;
        let value = match self.peek() {
            Some(b'"') => self.quoted()?,
            _ => self
                .token()
                .ok_or_else(|| self.error("a token or a quoted-string after '='"))?,
        };
        Ok(Pair { name, value })
    }

    fn token(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(is_tchar) {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    /// A quoted-string (RFC 9110 §5.6.4), the opening quote at `self.at`.
    fn quoted(&mut self) -> Result<String, ParseError> {
        let open = self.at;
        self.at += 1;
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None => {
                    return Err(ParseError {
                        at: open,
                        what: "a closing quote for this quoted-string",
                    });
                }
                Some(b'"') => {
                    self.at += 1;
                    return Ok(String::from_utf8_lossy(&out).into_owned());
                }
                Some(b'\\') => match self.s.get(self.at + 1).copied() {
                    Some(c) if c == b'\t' || c == b' ' || c.is_ascii_graphic() || c >= 0x80 => {
                        out.push(c);
                        self.at += 2;
                    }
                    Some(_) => return Err(self.error("a visible character after '\\'")),
                    None => {
                        return Err(ParseError {
                            at: open,
                            what: "a closing quote (the last '\\' escapes nothing)",
                        });
                    }
                },
                Some(c) if c == b'\t' || c == b' ' || c.is_ascii_graphic() || c >= 0x80 => {
                    out.push(c);
                    self.at += 1;
                }
                Some(_) => return Err(self.error("no control character in a quoted-string")),
            }
        }
    }
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(value: &str) -> Vec<Vec<(String, String)>> {
        parse(value)
            .unwrap_or_else(|e| panic!("{value:?}: {e}"))
            .into_iter()
            .map(|e| e.into_iter().map(|p| (p.name, p.value)).collect())
            .collect()
    }

    fn owned(elements: &[&[(&str, &str)]]) -> Vec<Vec<(String, String)>> {
        elements
            .iter()
            .map(|e| {
                e.iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_rfc_examples_parse() {
        assert_eq!(pairs(r#"for="_gazonk""#), owned(&[&[("for", "_gazonk")]]));
        assert_eq!(
            pairs(r#"For="[2001:db8:cafe::17]:4711""#),
            owned(&[&[("For", "[2001:db8:cafe::17]:4711")]])
        );
        assert_eq!(
            pairs("for=192.0.2.60;proto=http;by=203.0.113.43"),
            owned(&[&[
                ("for", "192.0.2.60"),
                ("proto", "http"),
                ("by", "203.0.113.43")
            ]])
        );
        assert_eq!(
            pairs("for=192.0.2.43, for=198.51.100.17"),
            owned(&[&[("for", "192.0.2.43")], &[("for", "198.51.100.17")]])
        );
    }

    #[test]
    fn quoted_commas_semicolons_and_escapes_stay_in_their_value() {
        assert_eq!(
            pairs(r#"for="a,b;c=d", by=x"#),
            owned(&[&[("for", "a,b;c=d")], &[("by", "x")]])
        );
        assert_eq!(
            pairs(r#"host="a\"b\\c";proto=http"#),
            owned(&[&[("host", r#"a"b\c"#), ("proto", "http")]])
        );
        assert_eq!(pairs(r#"for="\,""#), owned(&[&[("for", ",")]]));
        assert_eq!(pairs(r#"for="""#), owned(&[&[("for", "")]]));
    }

    #[test]
    fn empty_elements_and_pairs_are_skipped_but_not_everything_empty() {
        assert_eq!(
            pairs("for=a, ,\t, for=b"),
            owned(&[&[("for", "a")], &[("for", "b")]])
        );
        assert_eq!(
            pairs(",for=a;;by=b;,"),
            owned(&[&[("for", "a"), ("by", "b")]])
        );
        assert_eq!(
            pairs("for=a ; by=b"),
            owned(&[&[("for", "a"), ("by", "b")]])
        );
        for empty in ["", " ", ",", " , ;, ", ";"] {
            assert!(!is_valid(empty), "{empty:?}");
        }
    }

    #[test]
    fn broken_values_do_not_parse() {
        for broken in [
            r#"for="6.6.6.6"#,           // open quote
            r#"for="6.6.6.6\"#,          // trailing backslash
            r#"for="6.6.6.6\""#,         // the closing quote escaped
            "for",                       // no '='
            "for=",                      // no value
            "=x",                        // no name
            "for =a",                    // space before '='
            "for= a",                    // space after '='
            "for=a b",                   // two tokens
            "for=a\"b\"",                // a quote inside a token
            r#"for="a"b"#,               // text after a quoted-string
            "for=[::1]",                 // '[' is no tchar: quote it
            "for=a;for=b",               // a parameter twice
            "for=a;FOR=b",               // ignoring case
            "for=\"a\u{7}\"",            // a control character
            "for=a,by=\"b",              // valid, then broken
            "for=a, by=b\r\n, for=evil", // a line break
        ] {
            assert!(!is_valid(broken), "{broken:?} parsed: {:?}", parse(broken));
        }
        // The same parameter in two elements is two hops, not a duplicate.
        assert!(is_valid("for=a, for=b"));
    }

    #[test]
    fn errors_say_where_and_what() {
        let e = parse(r#"for=a, for="6.6.6.6"#).unwrap_err();
        assert_eq!(e.at, 11);
        assert!(e.what.contains("closing quote"), "{e}");
    }

    /// Whatever a valid client value holds, appending the gateway's element to it yields
    /// a list whose last element is the gateway's, as sent.
    #[test]
    fn an_element_appended_to_a_valid_value_is_the_last_element() {
        for client in [
            "for=1.2.3.4",
            r#"for="a,b;c";by="\"""#,
            "for=a, , ;",
            r#"host="x\\""#,
        ] {
            let joined = format!("{client}, for=127.0.0.1;proto=http");
            let elements = pairs(&joined);
            assert_eq!(
                elements.last().unwrap(),
                &owned(&[&[("for", "127.0.0.1"), ("proto", "http")]])[0],
                "{client:?}"
            );
        }
    }

    proptest::proptest! {
        /// Over strings of the characters that matter to the grammar: parsing never
        /// panics, and whatever parses keeps the gateway's element last, as sent, once
        /// the proxy appends it; and an X-Forwarded-For that passes stays a list of
        /// nodes with the gateway's address appended.
        #[test]
        fn the_gateways_element_stays_last_whatever_the_client_sent(
            value in r#"[a-z0-9=;,"\\ \t\[\]:._-]{0,40}"#,
        ) {
            if let Ok(client) = parse(&value) {
                let joined = format!("{value}, for=127.0.0.1;proto=http");
                let elements = parse(&joined).expect("a valid value stays valid");
                proptest::prop_assert_eq!(elements.len(), client.len() + 1);
                let last = elements.last().unwrap();
                proptest::prop_assert_eq!(
                    last.iter().map(|p| (p.name.as_str(), p.value.as_str())).collect::<Vec<_>>(),
                    vec![("for", "127.0.0.1"), ("proto", "http")]
                );
            }
            if x_forwarded_for_is_valid(&value) {
                let appended = format!("{value}, 127.0.0.1");
                proptest::prop_assert!(x_forwarded_for_is_valid(&appended));
            }
        }
    }

    /// A value made of pairs, some with quoted-strings full of commas, semicolons,
    /// quotes and backslashes (escaped as a sender must).
    fn valid_value() -> impl proptest::strategy::Strategy<Value = (String, Vec<Element>)> {
        use proptest::prelude::*;
        let pair = (
            "[a-zA-Z][a-zA-Z0-9_-]{0,6}",
            prop_oneof![
                "[a-zA-Z0-9._~!-]{1,8}".prop_map(|v| (v.clone(), v)),
                r#"[a-z0-9 ,;="\\\[\]:]{0,10}"#.prop_map(|v| {
                    let quoted: String = v
                        .chars()
                        .flat_map(|c| match c {
                            '"' | '\\' => vec!['\\', c],
                            c => vec![c],
                        })
                        .collect();
                    (format!("\"{quoted}\""), v)
                }),
            ],
        );
        proptest::collection::vec(proptest::collection::vec(pair, 1..4), 1..4).prop_map(
            |elements| {
                let mut text = Vec::new();
                let mut parsed = Vec::new();
                for element in elements {
                    let mut seen = std::collections::HashSet::new();
                    let mut pairs = Vec::new();
                    let mut parts = Vec::new();
                    for (name, (sent, value)) in element {
                        if seen.insert(name.to_ascii_lowercase()) {
                            parts.push(format!("{name}={sent}"));
                            pairs.push(Pair { name, value });
                        }
                    }
                    text.push(parts.join(";"));
                    parsed.push(pairs);
                }
                (text.join(", "), parsed)
            },
        )
    }

    proptest::proptest! {
        /// What a sender writes by the grammar parses back to what it meant, and the
        /// gateway's element appended to it is the last, as sent.
        #[test]
        fn valid_values_parse_back_and_keep_the_gateways_element_last(
            (value, elements) in valid_value(),
        ) {
            let parsed = parse(&value);
            proptest::prop_assert_eq!(parsed.as_ref(), Ok(&elements));
            let joined = parse(&format!("{value}, for=127.0.0.1;proto=http")).unwrap();
            proptest::prop_assert_eq!(joined.len(), elements.len() + 1);
            proptest::prop_assert_eq!(
                joined.last().unwrap(),
                &vec![
                    Pair { name: "for".into(), value: "127.0.0.1".into() },
                    Pair { name: "proto".into(), value: "http".into() },
                ]
            );
            // Cut anywhere inside a quoted-string, the value no longer parses.
            if let Some(open) = value.find('"') {
                proptest::prop_assert!(!is_valid(&value[..=open]));
            }
        }
    }

    #[test]
    fn x_forwarded_for_takes_addresses_ports_and_obfuscated_names() {
        for valid in [
            "203.0.113.7",
            "203.0.113.7, 2001:db8::1",
            "[2001:db8::1], [2001:db8::1]:4711,203.0.113.7:80",
            "unknown, _hidden.1-a",
            "203.0.113.7, , 10.0.0.1",
        ] {
            assert!(x_forwarded_for_is_valid(valid), "{valid:?}");
        }
        for invalid in [
            "",
            " , ",
            "203.0.113.7 10.0.0.1",
            "203.0.113.7, evil.example",
            "\"203.0.113.7\"",
            "_",
            "_a b",
            "203.0.113.7; for=x",
            "300.1.1.1",
            "[203.0.113.7]",
        ] {
            assert!(!x_forwarded_for_is_valid(invalid), "{invalid:?}");
        }
    }
}
