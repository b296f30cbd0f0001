//! The canonical form of a JSON body, for fingerprints (SPEC S4): object keys sorted,
//! insignificant whitespace dropped, one spelling per string and per number.
//!
//! Parsed here rather than through `serde_json::Value` for two reasons:
//!
//! - **Numbers keep every digit.** A `Value` holds a number that is neither a `u64` nor
//!   an `i64` as a double, so `12345678901234567890123` and `12345678901234567890124`,
//!   or `0.1` and `0.10000000000000000001`, became one value and their requests one
//!   fingerprint: a retry with a changed amount was replayed instead of refused.
//!   serde_json's default parser also misreads some numbers whose digits run past
//!   2^53: about one in ten 17-digit doubles, by a unit in the last place, onto a
//!   neighbour that another text names exactly (`394301.33835633675` was read as
//!   `394301.3383563367`), and integers written with trailing zeros
//!   (`-77947587844713.000` was read as a fraction). Here a number is written
//!   from its own digits, so equal values (`1`, `1.0`, `10e-1`) match and different
//!   values do not (integers of 10^19 and more: see [`write_number`]).
//! - **Repeated keys are kept.** A `Value` keeps the last of `{"a":1,"a":2}`, making it
//!   the same request as `{"a":2}`, although a parser that keeps the first value reads
//!   the two differently. Here every entry is kept, in its order among those with the
//!   same key.
//!
//! It also allocates less: strings without escapes are borrowed from the body.
//!
//! Because every object's entries are sorted here anyway, the parser also tells
//! whether a name repeats within one object, after unescaping (`"a"` and `"\u0061"`
//! are one name): I-JSON (RFC 7493 §2.3) forbids it, since parsers disagree on which
//! entry counts, and the layer refuses such a keyed body. Sorting while parsing costs
//! what sorting while writing did; the check is one comparison per entry.
//!
//! Everything else is written as a `Value` with sorted keys writes it, because that is
//! what the fingerprints that stores already hold were computed from: they still
//! match, except for the bodies above and integral values from 2^53 to 10^19 written
//! with a fraction or an exponent (a `Value` writes the double's binary value). The
//! tests check this against that `Value`-based form. What serde_json
//! rejects is rejected here too (the caller then hashes the raw bytes), except numbers
//! beyond a double's range, which are canonical here.

use std::borrow::Cow;

/// The deepest nesting of arrays and objects accepted, as `serde_json`'s default
/// recursion limit allows; a deeper body is hashed as raw bytes, as it always was.
const MAX_DEPTH: usize = 127;

/// The most significant digits an exponent may have. A number with a longer one
/// (`1e10000000000000`, far past any double) makes the body raw bytes: exact, and
/// never reached by a real request.
const MAX_EXPONENT_DIGITS: usize = 12;

/// One parsed JSON value, borrowing from the body where it can.
#[derive(Debug)]
pub(crate) enum Node<'a> {
    Null,
    Bool(bool),
    /// The number's text, checked against JSON's grammar.
    Number(&'a [u8]),
    String(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    /// Entries in the body's order, repeated keys included.
    Object(Vec<(Cow<'a, str>, Node<'a>)>),
}

/// A JSON body as parsed: its values (each object's entries sorted by name) and the
/// first name found repeated within one object, if any.
#[derive(Debug)]
pub(crate) struct Document<'a> {
    pub(crate) root: Node<'a>,
    pub(crate) duplicate: Option<Cow<'a, str>>,
}

/// Appends the canonical form of `body` to `out`, leaving out the values at the
/// `ignored` pointers (each a list of unescaped reference tokens). Returns the name
/// repeated within an object (`Some(None)` when none is), or `None`, with `out`
/// unchanged, when `body` is not JSON.
pub(crate) fn canonicalize(
    body: &[u8],
    ignored: &[Vec<String>],
    out: &mut Vec<u8>,
) -> Option<Option<String>> {
    let Document { root, duplicate } = parse(body, ignored)?;
    write(&root, out);
    Some(duplicate.map(Cow::into_owned))
}

/// `body` parsed, the values at the `ignored` pointers left out (a repeated name is
/// found before they are); `None` when it is not JSON.
pub(crate) fn parse<'a>(body: &'a [u8], ignored: &[Vec<String>]) -> Option<Document<'a>> {
    let mut parser = Parser {
        src: body,
        pos: 0,
        duplicate: None,
    };
    let mut root = parser.document()?;
    for pointer in ignored {
        remove_pointer(&mut root, pointer);
    }
    Some(Document {
        root,
        duplicate: parser.duplicate,
    })
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    /// The first name seen twice in one object.
    duplicate: Option<Cow<'a, str>>,
}

impl<'a> Parser<'a> {
    fn document(&mut self) -> Option<Node<'a>> {
        let value = self.value(0)?;
        self.skip_whitespace();
        (self.pos == self.src.len()).then_some(value)
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.src.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn literal(&mut self, word: &[u8], node: Node<'a>) -> Option<Node<'a>> {
        let end = self.pos + word.len();
        (self.src.get(self.pos..end) == Some(word)).then(|| {
            self.pos = end;
            node
        })
    }

    /// `depth` is how many arrays and objects enclose the value.
    fn value(&mut self, depth: usize) -> Option<Node<'a>> {
        self.skip_whitespace();
        match self.peek()? {
            b'n' => self.literal(b"null", Node::Null),
            b't' => self.literal(b"true", Node::Bool(true)),
            b'f' => self.literal(b"false", Node::Bool(false)),
            b'"' => self.string().map(Node::String),
            b'-' | b'0'..=b'9' => self.number().map(Node::Number),
            b'[' if depth < MAX_DEPTH => self.array(depth + 1),
            b'{' if depth < MAX_DEPTH => self.object(depth + 1),
            _ => None,
        }
    }

    fn array(&mut self, depth: usize) -> Option<Node<'a>> {
        self.pos += 1; // [
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Some(Node::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.skip_whitespace();
            match self.peek()? {
                b',' => self.pos += 1,
                b']' => {
                    self.pos += 1;
                    return Some(Node::Array(items));
                }
                _ => return None,
            }
        }
    }

    fn object(&mut self, depth: usize) -> Option<Node<'a>> {
        self.pos += 1; // {
        let mut entries = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Some(Node::Object(entries));
        }
        loop {
            self.skip_whitespace();
            if self.peek()? != b'"' {
                return None;
            }
            let key = self.string()?;
            self.skip_whitespace();
            if self.peek()? != b':' {
                return None;
            }
            self.pos += 1;
            entries.push((key, self.value(depth)?));
            self.skip_whitespace();
            match self.peek()? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    // By the names' UTF-8 bytes, the canonical order; stable, so a
                    // repeated name keeps its entries in the body's order, and they
                    // end up side by side.
                    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                    if self.duplicate.is_none()
                        && let Some(pair) = entries.windows(2).find(|w| w[0].0 == w[1].0)
                    {
                        self.duplicate = Some(pair[0].0.clone());
                    }
                    return Some(Node::Object(entries));
                }
                _ => return None,
            }
        }
    }

    /// A string starting at its opening quote, decoded. Borrowed unless it has escapes.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        self.pos += 1; // "
        let start = self.pos;
        // The common case: no escape before the closing quote.
        loop {
            match *self.src.get(self.pos)? {
                b'"' => {
                    let s = std::str::from_utf8(&self.src[start..self.pos]).ok()?;
                    self.pos += 1;
                    return Some(Cow::Borrowed(s));
                }
                b'\\' => break,
                0x00..=0x1f => return None,
                _ => self.pos += 1,
            }
        }
        let mut decoded = String::with_capacity(self.pos - start + 16);
        decoded.push_str(std::str::from_utf8(&self.src[start..self.pos]).ok()?);
        let mut run = self.pos;
        loop {
            match *self.src.get(self.pos)? {
                b'"' => {
                    decoded.push_str(std::str::from_utf8(&self.src[run..self.pos]).ok()?);
                    self.pos += 1;
                    return Some(Cow::Owned(decoded));
                }
                b'\\' => {
                    decoded.push_str(std::str::from_utf8(&self.src[run..self.pos]).ok()?);
                    decoded.push(self.escape()?);
                    run = self.pos;
                }
                0x00..=0x1f => return None,
                _ => self.pos += 1,
            }
        }
    }

    /// The character of the escape whose backslash is at `pos`; `pos` ends after it.
    fn escape(&mut self) -> Option<char> {
        let c = match *self.src.get(self.pos + 1)? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                self.pos += 2;
                return self.unicode_escape();
            }
            _ => return None,
        };
        self.pos += 2;
        Some(c)
    }

    /// The code point of a `\u` escape whose four digits start at `pos` (a surrogate
    /// pair takes a second escape); `pos` ends after the digits.
    fn unicode_escape(&mut self) -> Option<char> {
        let first = self.hex4()?;
        let code = match first {
            0xd800..=0xdbff => {
                if self.src.get(self.pos..self.pos + 2)? != b"\\u" {
                    return None;
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return None;
                }
                0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
            }
            0xdc00..=0xdfff => return None,
            _ => first,
        };
        char::from_u32(code)
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.src.get(self.pos..self.pos + 4)?;
        let mut code = 0;
        for &d in digits {
            code = code * 16 + char::from(d).to_digit(16)?;
        }
        self.pos += 4;
        Some(code)
    }

    /// A number's text: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Option<&'a [u8]> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek()? {
            b'0' => self.pos += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.at_least_one_digit()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            let digits = self.pos;
            self.at_least_one_digit()?;
            let significant = self.src[digits..self.pos]
                .iter()
                .skip_while(|&&d| d == b'0')
                .count();
            if significant > MAX_EXPONENT_DIGITS {
                return None;
            }
        }
        Some(&self.src[start..self.pos])
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
    }

    fn at_least_one_digit(&mut self) -> Option<()> {
        let start = self.pos;
        self.digits();
        (self.pos > start).then_some(())
    }
}

/// Removes the values `pointer` names. Where an object repeats a key, the pointer
/// follows (and removes) every entry with it.
fn remove_pointer(node: &mut Node<'_>, pointer: &[String]) {
    let Some((token, rest)) = pointer.split_first() else {
        return;
    };
    match node {
        Node::Object(entries) if rest.is_empty() => entries.retain(|(k, _)| k != token),
        Node::Object(entries) => entries
            .iter_mut()
            .filter(|(k, _)| k == token)
            .for_each(|(_, v)| remove_pointer(v, rest)),
        // An index is whatever `usize` parses, as for a `Value`, so stored fingerprints
        // that ignore array items keep matching.
        Node::Array(items) => match token.parse::<usize>() {
            Ok(i) if i < items.len() && rest.is_empty() => {
                items.remove(i);
            }
            Ok(i) if i < items.len() => remove_pointer(&mut items[i], rest),
            _ => {}
        },
        _ => {}
    }
}

fn write(node: &Node<'_>, out: &mut Vec<u8>) {
    match node {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Node::Number(text) => write_number(text, out),
        Node::String(s) => write_string(s, out),
        Node::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Node::Object(entries) => {
            // Sorted by the parser already (and left so by ignored pointers' removal).
            out.push(b'{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write(v, out);
            }
            out.push(b'}');
        }
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json's escaping has one spelling per string, and is what stored
    // fingerprints were computed with.
    serde_json::to_writer(&mut *out, s).expect("a string always serialises");
}

/// Writes a number (text already checked against JSON's grammar) by its exact decimal
/// value, in the spelling a `Value` gives the values a double holds exactly (so that their
/// stored fingerprints still match):
///
/// - an integer below 10^19 in magnitude as its digits (`100` for `1e2` and `100.0`);
/// - an integer written without fraction or exponent, up to `u64::MAX`, likewise;
/// - anything else as `d.ddde-x` with no trailing zeros (`2.5e-4`, `1e19`), as Rust's
///   `{:e}` formats a double, but with every significant digit of the text;
/// - zero as `0`, or `-0` when it carries a minus sign.
fn write_number(text: &[u8], out: &mut Vec<u8>) {
    let (negative, text) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let int_len = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let (int, rest) = text.split_at(int_len);
    let (frac, exp) = match rest.split_first() {
        Some((b'.', rest)) => rest.split_at(rest.iter().take_while(|b| b.is_ascii_digit()).count()),
        _ => (&[][..], rest),
    };
    let plain_integer = frac.is_empty() && exp.is_empty();

    // The significant digits go straight into `out`, then lose their leading and
    // trailing zeros: value = digits × 10^scale.
    if negative {
        out.push(b'-');
    }
    let digits_at = out.len();
    out.extend_from_slice(int);
    out.extend_from_slice(frac);
    let leading = out[digits_at..].iter().take_while(|&&d| d == b'0').count();
    if digits_at + leading == out.len() {
        out.truncate(digits_at);
        out.push(b'0');
        return;
    }
    out.drain(digits_at..digits_at + leading);
    let trailing = out[digits_at..]
        .iter()
        .rev()
        .take_while(|&&d| d == b'0')
        .count();
    out.truncate(out.len() - trailing);
    let n = (out.len() - digits_at) as i64;
    let scale = exponent(exp) - frac.len() as i64 + trailing as i64;

    let integer_digits = n + scale;
    let as_integer = scale >= 0
        && (integer_digits <= 19
            || (plain_integer && !negative && integer_digits == 20 && {
                let mut whole = [b'0'; 20];
                whole[..n as usize].copy_from_slice(&out[digits_at..]);
                whole <= *b"18446744073709551615"
            }));
    if as_integer {
        out.resize(out.len() + scale as usize, b'0');
        return;
    }
    if n > 1 {
        out.insert(digits_at + 1, b'.');
    }
    out.push(b'e');
    out.extend_from_slice((n - 1 + scale).to_string().as_bytes());
}

/// The value of an exponent part (`e-7`, `E+12`, or nothing). The parser accepts at
/// most [`MAX_EXPONENT_DIGITS`] significant digits, so this cannot overflow.
fn exponent(part: &[u8]) -> i64 {
    let Some((_, rest)) = part.split_first() else {
        return 0;
    };
    let (negative, digits) = match rest.split_first() {
        Some((b'-', d)) => (true, d),
        Some((b'+', d)) => (false, d),
        _ => (false, rest),
    };
    let value = digits
        .iter()
        .fold(0i64, |v, &d| v * 10 + i64::from(d - b'0'));
    if negative { -value } else { value }
}

#[cfg(test)]
mod tests;
