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
//!   values do not (integers of 10^19 and more: see `write::write_number`).
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
//! tests check this against that `Value`-based form.
//!
//! What serde_json rejects is rejected here too, with why (see [`UnreadableJson`]),
//! except numbers beyond a double's range, which are canonical here, and nesting past
//! serde_json's 128 levels, which is read up to [`MAX_JSON_DEPTH`]. The parser, the
//! writers and the tree's drop keep their own stacks, so depth costs heap, not the
//! thread's stack.

use std::borrow::Cow;

use crate::json::unreadable::{MAX_EXPONENT_DIGITS, MAX_JSON_DEPTH, UnreadableJson};

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

impl Node<'_> {
    /// Whether this is an array or object with something in it.
    fn holds_anything(&self) -> bool {
        match self {
            Node::Array(items) => !items.is_empty(),
            Node::Object(entries) => !entries.is_empty(),
            _ => false,
        }
    }
}

/// A tree as deep as the body may nest ([`MAX_JSON_DEPTH`]) is dropped with a stack of
/// its own: the compiler's recursive drop would take a thread's stack frame per level.
impl Drop for Node<'_> {
    fn drop(&mut self) {
        let mut pending: Vec<Node<'_>> = match self {
            Node::Array(items) if items.iter().any(Node::holds_anything) => std::mem::take(items),
            Node::Object(entries) if entries.iter().any(|(_, v)| v.holds_anything()) => {
                entries.drain(..).map(|(_, v)| v).collect()
            }
            _ => return,
        };
        while let Some(mut node) = pending.pop() {
            match &mut node {
                Node::Array(items) => pending.append(items),
                Node::Object(entries) => pending.extend(entries.drain(..).map(|(_, v)| v)),
                _ => {}
            }
            // `node` is dropped here with nothing left in it.
        }
    }
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
/// repeated within an object (`Ok(None)` when none is), or why `body` is not JSON
/// idem reads, with `out` unchanged.
pub(crate) fn canonicalize(
    body: &[u8],
    ignored: &[Vec<String>],
    out: &mut Vec<u8>,
) -> Result<Option<String>, UnreadableJson> {
    let Document { root, duplicate } = parse(body, ignored)?;
    write::write(&root, out);
    Ok(duplicate.map(Cow::into_owned))
}

/// `body` parsed, the values at the `ignored` pointers left out (a repeated name is
/// found before they are); `Err` with why when it is not JSON idem reads.
pub(crate) fn parse<'a>(
    body: &'a [u8],
    ignored: &[Vec<String>],
) -> Result<Document<'a>, UnreadableJson> {
    let mut parser = Parser {
        src: body,
        pos: 0,
        duplicate: None,
    };
    let mut root = parser.document()?;
    for pointer in ignored {
        remove_pointer(&mut root, pointer);
    }
    Ok(Document {
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

/// An array or object being read: what it holds so far.
enum Open<'a> {
    Array(Vec<Node<'a>>),
    /// The entries so far, and the name of the one whose value is being read.
    Object(Vec<(Cow<'a, str>, Node<'a>)>, Cow<'a, str>),
}

impl<'a> Parser<'a> {
    /// The body's one value. Arrays and objects being read are kept on a stack of
    /// their own, not the thread's, so that depth costs heap, up to [`MAX_JSON_DEPTH`].
    fn document(&mut self) -> Result<Node<'a>, UnreadableJson> {
        let mut open: Vec<Open<'a>> = Vec::new();
        'value: loop {
            self.skip_whitespace();
            let mut node = match self.peek() {
                Some(b'[' | b'{') if open.len() >= MAX_JSON_DEPTH => {
                    return Err(UnreadableJson::TooDeep { at: self.pos });
                }
                Some(b'[') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    if self.peek() != Some(b']') {
                        open.push(Open::Array(Vec::new()));
                        continue 'value;
                    }
                    self.pos += 1;
                    Node::Array(Vec::new())
                }
                Some(b'{') => {
                    self.pos += 1;
                    self.skip_whitespace();
                    if self.peek() != Some(b'}') {
                        let name = self.member_name()?;
                        open.push(Open::Object(Vec::new(), name));
                        continue 'value;
                    }
                    self.pos += 1;
                    Node::Object(Vec::new())
                }
                _ => self.scalar()?,
            };
            // A whole value: it goes into the innermost open array or object, which
            // may end with it, and so on outwards.
            loop {
                self.skip_whitespace();
                let closed = match open.last_mut() {
                    None if self.pos == self.src.len() => return Ok(node),
                    None => return Err(self.syntax()),
                    Some(Open::Array(items)) => {
                        items.push(node);
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                continue 'value;
                            }
                            Some(b']') => b']',
                            _ => return Err(self.syntax()),
                        }
                    }
                    Some(Open::Object(entries, name)) => {
                        entries.push((std::mem::take(name), node));
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                self.skip_whitespace();
                                *name = self.member_name()?;
                                continue 'value;
                            }
                            Some(b'}') => b'}',
                            _ => return Err(self.syntax()),
                        }
                    }
                };
                self.pos += 1;
                node = match (open.pop(), closed) {
                    (Some(Open::Array(items)), b']') => Node::Array(items),
                    (Some(Open::Object(entries, _)), b'}') => self.object(entries),
                    _ => unreachable!("closed by the bracket it opened with"),
                };
            }
        }
    }

    /// An object whose entries are all read: sorted by the names' UTF-8 bytes, the
    /// canonical order (stably, so a repeated name keeps its entries in the body's
    /// order, and they end up side by side).
    fn object(&mut self, mut entries: Vec<(Cow<'a, str>, Node<'a>)>) -> Node<'a> {
        entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        if self.duplicate.is_none()
            && let Some(pair) = entries.windows(2).find(|w| w[0].0 == w[1].0)
        {
            self.duplicate = Some(pair[0].0.clone());
        }
        Node::Object(entries)
    }

    /// A member's name and the `:` after it, whitespace skipped before.
    fn member_name(&mut self) -> Result<Cow<'a, str>, UnreadableJson> {
        if self.peek() != Some(b'"') {
            return Err(self.syntax());
        }
        let name = self.string()?;
        self.skip_whitespace();
        if self.peek() != Some(b':') {
            return Err(self.syntax());
        }
        self.pos += 1;
        Ok(name)
    }

    /// A value that is no array or object.
    fn scalar(&mut self) -> Result<Node<'a>, UnreadableJson> {
        match self.peek() {
            Some(b'n') => self.literal(b"null", Node::Null),
            Some(b't') => self.literal(b"true", Node::Bool(true)),
            Some(b'f') => self.literal(b"false", Node::Bool(false)),
            Some(b'"') => self.string().map(Node::String),
            Some(b'-' | b'0'..=b'9') => self.number().map(Node::Number),
            _ => Err(self.syntax()),
        }
    }

    fn syntax(&self) -> UnreadableJson {
        UnreadableJson::Syntax { at: self.pos }
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.src.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn literal(&mut self, word: &[u8], node: Node<'a>) -> Result<Node<'a>, UnreadableJson> {
        let end = self.pos + word.len();
        if self.src.get(self.pos..end) != Some(word) {
            return Err(self.syntax());
        }
        self.pos = end;
        Ok(node)
    }

    /// `src[start..end]` as UTF-8.
    fn utf8(&self, start: usize, end: usize) -> Result<&'a str, UnreadableJson> {
        std::str::from_utf8(&self.src[start..end]).map_err(|e| UnreadableJson::InvalidUtf8 {
            at: start + e.valid_up_to(),
        })
    }

    /// A string starting at its opening quote, decoded. Borrowed unless it has escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, UnreadableJson> {
        self.pos += 1; // "
        let start = self.pos;
        // The common case: no escape before the closing quote.
        loop {
            match self.peek() {
                Some(b'"') => {
                    let s = self.utf8(start, self.pos)?;
                    self.pos += 1;
                    return Ok(Cow::Borrowed(s));
                }
                Some(b'\\') => break,
                Some(0x00..=0x1f) | None => return Err(self.syntax()),
                Some(_) => self.pos += 1,
            }
        }
        let mut decoded = String::with_capacity(self.pos - start + 16);
        decoded.push_str(self.utf8(start, self.pos)?);
        let mut run = self.pos;
        loop {
            match self.peek() {
                Some(b'"') => {
                    decoded.push_str(self.utf8(run, self.pos)?);
                    self.pos += 1;
                    return Ok(Cow::Owned(decoded));
                }
                Some(b'\\') => {
                    decoded.push_str(self.utf8(run, self.pos)?);
                    decoded.push(self.escape()?);
                    run = self.pos;
                }
                Some(0x00..=0x1f) | None => return Err(self.syntax()),
                Some(_) => self.pos += 1,
            }
        }
    }

    /// The character of the escape whose backslash is at `pos`; `pos` ends after it.
    fn escape(&mut self) -> Result<char, UnreadableJson> {
        let c = match self.src.get(self.pos + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => return self.unicode_escape(),
            _ => return Err(UnreadableJson::Syntax { at: self.pos + 1 }),
        };
        self.pos += 2;
        Ok(c)
    }

    /// The code point of the `\u` escape whose backslash is at `pos` (a surrogate pair
    /// takes a second escape); `pos` ends after its digits.
    fn unicode_escape(&mut self) -> Result<char, UnreadableJson> {
        let backslash = self.pos;
        let lone = UnreadableJson::LoneSurrogate { at: backslash };
        self.pos += 2;
        let first = self.hex4()?;
        let code = match first {
            0xd800..=0xdbff => {
                if self.src.get(self.pos..self.pos + 2) != Some(&b"\\u"[..]) {
                    return Err(lone);
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&second) {
                    return Err(lone);
                }
                0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
            }
            0xdc00..=0xdfff => return Err(lone),
            _ => first,
        };
        char::from_u32(code).ok_or(lone)
    }

    fn hex4(&mut self) -> Result<u32, UnreadableJson> {
        let mut code = 0;
        for i in 0..4 {
            let digit = self
                .src
                .get(self.pos + i)
                .and_then(|&d| char::from(d).to_digit(16))
                .ok_or(UnreadableJson::Syntax { at: self.pos + i })?;
            code = code * 16 + digit;
        }
        self.pos += 4;
        Ok(code)
    }

    /// A number's text: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self) -> Result<&'a [u8], UnreadableJson> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.syntax()),
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
                return Err(UnreadableJson::LongExponent { at: start });
            }
        }
        Ok(&self.src[start..self.pos])
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
    }

    fn at_least_one_digit(&mut self) -> Result<(), UnreadableJson> {
        let start = self.pos;
        self.digits();
        if self.pos == start {
            return Err(self.syntax());
        }
        Ok(())
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

mod write;

#[cfg(test)]
mod tests;
