//! Header names that differ from the key's or a tenant's only by `_` for `-` (SPEC
//! S14), which some upstream stacks read as the name they resemble.

use http::{HeaderMap, HeaderName};

/// The first header whose name is not one of `names` but would be read as one by a
/// stack that folds `_` into `-` (CGI and WSGI servers, nginx with
/// `underscores_in_headers`): `Idempotency_Key` for `Idempotency-Key`. Such a stack
/// would see a key or a tenant the layer never read.
pub(crate) fn look_alike<'a>(
    headers: &'a HeaderMap,
    names: &[&'a HeaderName],
) -> Option<(&'a HeaderName, &'a HeaderName)> {
    headers
        .keys()
        .filter(|sent| sent.as_str().contains('_'))
        .find_map(|sent| {
            let folded = sent
                .as_str()
                .bytes()
                .map(|b| if b == b'_' { b'-' } else { b });
            names
                .iter()
                .find(|name| name.as_str().bytes().eq(folded.clone()))
                .map(|name| (sent, *name))
        })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::HeaderValue;

    /// A header map of `fields`, in order, repeated names appended.
    pub(crate) fn headers(fields: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in fields {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn underscore_spellings_of_a_name_are_found() {
        let key = HeaderName::from_static("idempotency-key");
        let tenant = HeaderName::from_static("x-api-key");
        let names = [&key, &tenant];
        let h = headers(&[("idempotency_key", "k")]);
        assert_eq!(look_alike(&h, &names).map(|(_, n)| n), Some(&key));
        let h = headers(&[("x_api-key", "t"), ("content-type", "a/b")]);
        assert_eq!(look_alike(&h, &names).map(|(_, n)| n), Some(&tenant));
        let h = headers(&[("idempotency-key", "k"), ("x_other", "1")]);
        assert_eq!(look_alike(&h, &names), None);
    }
}
