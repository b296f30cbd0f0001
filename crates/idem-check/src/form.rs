//! Form bodies (`application/x-www-form-urlencoded`): how one is recognised, and the two
//! bodies the probes derive from it: a changed request that is still a valid form, and
//! the same request in other bytes.
//!
//! The same form, as an idempotency layer compares forms: the parameters sorted by name
//! (the order of a repeated name kept), percent-encoding normalised.

/// Whether `body`, which is not JSON, reads as a form: `name=value` pairs joined by
/// `&`, no spaces or line breaks.
pub fn looks_like_form(body: &[u8]) -> bool {
    !body.is_empty()
        && body.iter().all(|b| b.is_ascii_graphic())
        && body.split(|b| *b == b'&').all(|pair| {
            pair.iter()
                .position(|b| *b == b'=')
                .is_some_and(|eq| eq > 0)
        })
}

/// `form` with one parameter appended: another request, still a valid form.
pub fn changed(form: &[u8]) -> Vec<u8> {
    let mut out = form.to_vec();
    if !out.is_empty() && !out.ends_with(b"&") {
        out.push(b'&');
    }
    out.extend_from_slice(b"idem_check_changed=1");
    out
}

/// `form` as the same request in other bytes: its parameters in reverse order of name
/// (a repeated name's values keep their order), and one letter or digit percent-encoded.
pub fn equivalent(form: &[u8]) -> Vec<u8> {
    let mut pairs: Vec<Vec<u8>> = form
        .split(|b| *b == b'&')
        .filter(|p| !p.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let name = |p: &Vec<u8>| -> Vec<u8> {
        let raw = p.split(|b| *b == b'=').next().unwrap_or_default();
        form_urlencoded::parse(&[raw, b"="].concat())
            .next()
            .map(|(n, _)| n.into_owned().into_bytes())
            .unwrap_or_default()
    };
    // A stable sort keeps the values of a repeated name in their order.
    pairs.sort_by_key(|p| std::cmp::Reverse(name(p)));
    // One unreserved character spelt as its percent escape: a value's if any, else a
    // name's.
    let spot = pairs
        .iter()
        .enumerate()
        .find_map(|(i, p)| {
            let eq = p.iter().position(|b| *b == b'=')?;
            let j = p[eq + 1..].iter().position(u8::is_ascii_alphanumeric)?;
            Some((i, eq + 1 + j))
        })
        .or_else(|| {
            pairs
                .iter()
                .enumerate()
                .find_map(|(i, p)| Some((i, p.iter().position(u8::is_ascii_alphanumeric)?)))
        });
    if let Some((i, j)) = spot {
        let c = pairs[i][j];
        pairs[i].splice(j..=j, format!("%{c:02X}").into_bytes());
    }
    pairs.join(&b'&')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A form's parameters, decoded, sorted by name (a repeated name's order kept): what
    /// makes two forms the same request.
    fn parameters(form: &[u8]) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = form_urlencoded::parse(form)
            .map(|(n, v)| (n.into_owned(), v.into_owned()))
            .collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        pairs
    }

    #[test]
    fn forms_are_recognised_and_other_text_is_not() {
        for form in ["amount=500&currency=eur", "a=", "a=1&a=2", "q=%20x+y"] {
            assert!(looks_like_form(form.as_bytes()), "{form}");
        }
        for other in [
            "",
            "hello",
            "a=1 & b=2",
            "=1",
            "a=1&&b=2",
            "{\"a\":1}",
            "a=1\n",
        ] {
            assert!(!looks_like_form(other.as_bytes()), "{other}");
        }
    }

    #[test]
    fn the_changed_form_is_another_valid_form() {
        let base = b"amount=500&currency=eur";
        let changed = changed(base);
        assert!(looks_like_form(&changed));
        assert!(serde_json::from_slice::<serde_json::Value>(&changed).is_err());
        assert_ne!(parameters(&changed), parameters(base));
        assert_eq!(changed, b"amount=500&currency=eur&idem_check_changed=1");
    }

    #[test]
    fn the_equivalent_form_has_the_same_parameters_in_other_bytes() {
        for base in [
            &b"amount=500&currency=eur"[..],
            b"b=2&a=1&b=1&c=x%20y",
            b"only=",
            b"z=1",
        ] {
            let eq = equivalent(base);
            assert_ne!(eq, base, "{}", String::from_utf8_lossy(&eq));
            assert_eq!(
                parameters(&eq),
                parameters(base),
                "{}",
                String::from_utf8_lossy(&eq)
            );
            assert!(looks_like_form(&eq));
        }
        assert_eq!(
            equivalent(b"amount=500&currency=eur"),
            b"currency=%65ur&amount=500"
        );
        // The repeated name keeps its values' order.
        assert_eq!(equivalent(b"b=2&a=1&b=1"), b"b=%32&b=1&a=1");
    }
}
