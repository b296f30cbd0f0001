//! `application/x-www-form-urlencoded` bodies read as their parameters, so that two
//! spellings of one form fingerprint equal, as Stripe compares a retry's parameters.
//!
//! A body is `&`-separated `name[=value]` pairs (empty ones, as in `a=1&&b=2`, are
//! skipped). Names and values are percent-decoded, with `+` as a space (the WHATWG URL
//! standard's reading): `%41`, `%61` and `A`, `a` are the same letters, `%2B` is a
//! plus and `+` a space. The parameters are then ordered by name, bytewise; parameters
//! of one name keep the order they came in, since `items[]=a&items[]=b` and
//! `items[]=b&items[]=a` are different lists. A name without `=` differs from one with
//! an empty value (`a` is not `a=`), as Rack and PHP tell them apart.
//!
//! A body with a `%` that is not followed by two hex digits does not parse: it is then
//! hashed as raw bytes, as any body that is not a form.

/// One parameter, decoded: its name, and its value unless it had no `=`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Param {
    pub(crate) name: Vec<u8>,
    pub(crate) value: Option<Vec<u8>>,
}

/// The body's parameters in their canonical order, or `None` when a name or value does
/// not decode.
pub(crate) fn params(body: &[u8]) -> Option<Vec<Param>> {
    let mut params = Vec::new();
    for pair in body.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (&pair[..eq], Some(&pair[eq + 1..])),
            None => (pair, None),
        };
        params.push(Param {
            name: decode(name)?,
            value: match value {
                Some(v) => Some(decode(v)?),
                None => None,
            },
        });
    }
    // Stable: parameters of one name stay in the order they were sent.
    params.sort_by(|a, b| a.name.cmp(&b.name));
    Some(params)
}

/// `raw` with `+` as a space and each `%XX` as its byte; `None` for a stray `%`.
fn decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = raw.get(i + 1..i + 3)?;
                let hi = (hex[0] as char).to_digit(16)?;
                let lo = (hex[1] as char).to_digit(16)?;
                out.push((hi * 16 + lo) as u8);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(body: &str) -> Vec<(String, Option<String>)> {
        params(body.as_bytes())
            .unwrap()
            .into_iter()
            .map(|p| {
                (
                    String::from_utf8(p.name).unwrap(),
                    p.value.map(|v| String::from_utf8(v).unwrap()),
                )
            })
            .collect()
    }

    fn pair(n: &str, v: Option<&str>) -> (String, Option<String>) {
        (n.to_owned(), v.map(str::to_owned))
    }

    #[test]
    fn parameters_are_decoded_and_ordered_by_name_keeping_repeats_in_order() {
        assert_eq!(
            names("currency=eur&amount=100&items%5B%5D=b&items[]=a&note=a+b%2Bc"),
            [
                pair("amount", Some("100")),
                pair("currency", Some("eur")),
                pair("items[]", Some("b")),
                pair("items[]", Some("a")),
                pair("note", Some("a b+c")),
            ]
        );
        assert_eq!(names("a&&b=&"), [pair("a", None), pair("b", Some(""))]);
        assert_eq!(names(""), []);
        assert_eq!(names("x=%e2%82%ac"), [pair("x", Some("€"))]);
    }

    #[test]
    fn a_stray_percent_does_not_parse() {
        for body in ["a=%", "a=%4", "a=%zz", "%g1=1", "a=100%"] {
            assert!(params(body.as_bytes()).is_none(), "{body}");
        }
    }

    fn fp(ct: Option<&str>, body: &[u8], o: &crate::FingerprintOptions) -> crate::Fingerprint {
        crate::Fingerprint::compute("POST", "POST /v1/charges", ct, body, o)
    }

    #[test]
    fn a_form_is_compared_by_its_parameters() {
        let o = crate::FingerprintOptions::default();
        let form = Some("application/x-www-form-urlencoded");
        let charset = Some("Application/X-WWW-Form-Urlencoded; charset=utf-8");
        let a = fp(form, b"amount=100&currency=eur&metadata[order]=7", &o);
        // Another order, another spelling of the same bytes, a media type parameter.
        assert_eq!(
            a,
            fp(
                form,
                b"currency=eur&metadata%5Border%5D=7&amount=%31%30%30",
                &o
            )
        );
        assert_eq!(
            a,
            fp(charset, b"&metadata[order]=7&&amount=100&currency=eur&", &o)
        );
        // Another value, another name, a parameter more or less: another payload.
        assert_ne!(
            a,
            fp(form, b"amount=1000&currency=eur&metadata[order]=7", &o)
        );
        assert_ne!(a, fp(form, b"amount=100&currency=eur", &o));
        assert_ne!(
            a,
            fp(form, b"amount=100&currency=eur&metadata[order]=7&x", &o)
        );
        // Repeated names keep their order: a list is not a set.
        assert_ne!(
            fp(form, b"items[]=a&items[]=b", &o),
            fp(form, b"items[]=b&items[]=a", &o)
        );
        assert_eq!(
            fp(form, b"items[]=a&n=1&items[]=b", &o),
            fp(form, b"n=1&items[]=a&items[]=b", &o)
        );
        // `+` is a space, `%2B` a plus; `a` without `=` is not `a=`.
        assert_eq!(fp(form, b"q=a+b", &o), fp(form, b"q=a%20b", &o));
        assert_ne!(fp(form, b"q=a+b", &o), fp(form, b"q=a%2Bb", &o));
        assert_ne!(fp(form, b"a", &o), fp(form, b"a=", &o));
        // No two layouts meet: a name ending where a value starts.
        assert_ne!(fp(form, b"ab=c", &o), fp(form, b"a=bc", &o));
        // A stray `%` is read as bytes: only the same bytes match.
        assert_eq!(fp(form, b"a=100%", &o), fp(form, b"a=100%", &o));
        assert_ne!(fp(form, b"a=100%&b=1", &o), fp(form, b"b=1&a=100%", &o));
        // The same bytes under another media type are not a form.
        assert_ne!(
            a,
            fp(
                Some("text/plain"),
                b"amount=100&currency=eur&metadata[order]=7",
                &o
            )
        );
    }
}
