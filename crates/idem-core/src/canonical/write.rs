//! The canonical form written out: members in name order, no insignificant
//! whitespace, each number by its exact decimal value.

use super::Node;

/// Writes `root` in the canonical form, with a stack of its own (see [`Node`]'s drop).
pub(super) fn write(root: &Node<'_>, out: &mut Vec<u8>) {
    /// What is left to write, last first.
    enum Step<'n, 'a> {
        Value(&'n Node<'a>),
        Member(&'n str, &'n Node<'a>),
        Byte(u8),
    }
    let mut todo = vec![Step::Value(root)];
    while let Some(step) = todo.pop() {
        let node = match step {
            Step::Byte(b) => {
                out.push(b);
                continue;
            }
            Step::Member(name, value) => {
                write_string(name, out);
                out.push(b':');
                value
            }
            Step::Value(value) => value,
        };
        match node {
            Node::Null => out.extend_from_slice(b"null"),
            Node::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Node::Number(text) => write_number(text, out),
            Node::String(s) => write_string(s, out),
            Node::Array(items) => {
                out.push(b'[');
                todo.push(Step::Byte(b']'));
                for (i, item) in items.iter().enumerate().rev() {
                    todo.push(Step::Value(item));
                    if i > 0 {
                        todo.push(Step::Byte(b','));
                    }
                }
            }
            Node::Object(entries) => {
                // Sorted by the parser already (and left so by ignored pointers' removal).
                out.push(b'{');
                todo.push(Step::Byte(b'}'));
                for (i, (k, v)) in entries.iter().enumerate().rev() {
                    todo.push(Step::Member(k, v));
                    if i > 0 {
                        todo.push(Step::Byte(b','));
                    }
                }
            }
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
/// most [`MAX_EXPONENT_DIGITS`](crate::MAX_EXPONENT_DIGITS) significant digits, so
/// this cannot overflow.
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
