//! Method-override headers (SPEC S14): the method many frameworks run a request as,
//! whatever its method line says.
//!
//! The layer decides on the method the handler will act on, so that no override
//! sidesteps the key, and forwards the request as sent.

use http::request::Parts;
use http::{HeaderMap, HeaderName, Method};

/// The method-override headers the layer reads by default: many frameworks (Rails'
/// `Rack::MethodOverride`, Express' `method-override`, ASP.NET Core, Symfony, OData
/// services) run a request as the method one of these names.
pub const DEFAULT_METHOD_OVERRIDE_HEADERS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Whether two methods are one ignoring ASCII case (SPEC S14): `post` and `PoSt` are
/// keyed as `POST`, which is how most frameworks run them.
pub(crate) fn same_method(a: &Method, b: &Method) -> bool {
    a.as_str().eq_ignore_ascii_case(b.as_str())
}

/// The method the override headers `names` ask for, if any: every value of all of them
/// (several fields, or a comma-separated list) must name one method, ignoring case.
/// The error says which values disagree or do not name a method.
pub(crate) fn overriding_method(
    names: &[HeaderName],
    headers: &HeaderMap,
) -> Result<Option<Method>, String> {
    let mut found: Option<(Method, &HeaderName)> = None;
    for name in names {
        for field in headers.get_all(name) {
            let Ok(text) = field.to_str() else {
                return Err(format!(
                    "{name} is not visible ASCII, so it names no method"
                ));
            };
            for value in text.split(',').map(str::trim) {
                let method = Method::from_bytes(value.as_bytes())
                    .ok()
                    .filter(|_| !value.is_empty())
                    .ok_or_else(|| format!("{name}: {value:?} is not a method"))?;
                match &found {
                    None => found = Some((method, name)),
                    Some((first, _)) if same_method(first, &method) => {}
                    Some((first, first_name)) => {
                        return Err(format!(
                            "{first_name} asks for {first} and {name} for {method}; \
                             send one method override, or none"
                        ));
                    }
                }
            }
        }
    }
    Ok(found.map(|(method, _)| method))
}

/// The method the layer decides a request on, when it is not the one `parts` was sent
/// with: the overriding method (see [`overriding_method`]) if it is keyed, or if
/// neither is; the sent one if only that is keyed. So a request is keyed when either
/// method is, as the upstream may run either: a `GET` overridden to `POST` is keyed as
/// `POST`, a `POST` overridden to `PATCH` as `PATCH`, and a `POST` overridden to `GET`
/// stays keyed as `POST` for an upstream that ignores the override.
pub(crate) fn decided_method(
    keyed: &[Method],
    override_headers: &[HeaderName],
    parts: &Parts,
) -> Result<Option<Method>, String> {
    if override_headers.is_empty() {
        return Ok(None);
    }
    let Some(over) = overriding_method(override_headers, &parts.headers)? else {
        return Ok(None);
    };
    let is_keyed = |m: &Method| keyed.iter().any(|k| same_method(k, m));
    if same_method(&over, &parts.method) || (!is_keyed(&over) && is_keyed(&parts.method)) {
        return Ok(None);
    }
    Ok(Some(over))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::look_alike::tests::headers;

    /// Header fields as sent.
    type Fields = &'static [(&'static str, &'static str)];

    fn names() -> Vec<HeaderName> {
        DEFAULT_METHOD_OVERRIDE_HEADERS
            .iter()
            .map(|n| HeaderName::from_static(n))
            .collect()
    }

    #[test]
    fn one_override_in_any_spelling_names_its_method() {
        let names = names();
        let cases: [(Fields, Option<&str>); 6] = [
            (&[], None),
            (&[("x-http-method-override", "POST")], Some("POST")),
            (&[("X-HTTP-Method", " patch ")], Some("patch")),
            (&[("x-method-override", "POST, post")], Some("POST")),
            (
                &[
                    ("x-http-method-override", "post"),
                    ("x-http-method", "POST"),
                ],
                Some("post"),
            ),
            (&[("x-other", "DELETE")], None),
        ];
        for (fields, want) in cases {
            let got = overriding_method(&names, &headers(fields)).unwrap();
            assert_eq!(got.as_ref().map(Method::as_str), want, "{fields:?}");
        }
    }

    #[test]
    fn overrides_that_disagree_or_name_no_method_are_errors() {
        let names = names();
        let cases: [Fields; 5] = [
            &[
                ("x-http-method-override", "POST"),
                ("x-http-method", "PATCH"),
            ],
            &[
                ("x-http-method-override", "POST"),
                ("x-http-method-override", "GET"),
            ],
            &[("x-method-override", "POST, GET")],
            &[("x-http-method-override", "")],
            &[("x-http-method-override", "PO ST")],
        ];
        for fields in cases {
            assert!(
                overriding_method(&names, &headers(fields)).is_err(),
                "{fields:?}"
            );
        }
    }

    #[test]
    fn a_request_is_decided_on_whichever_method_is_keyed() {
        let keyed = [Method::POST, Method::PATCH];
        let names = names();
        let decide = |method: Method, over: Option<&str>| {
            let mut req = http::Request::builder().method(method);
            if let Some(over) = over {
                req = req.header("x-http-method-override", over);
            }
            let (parts, ()) = req.body(()).unwrap().into_parts();
            decided_method(&keyed, &names, &parts)
                .unwrap()
                .map(|m| m.to_string())
        };
        assert_eq!(decide(Method::GET, Some("POST")), Some("POST".into()));
        assert_eq!(decide(Method::POST, Some("PATCH")), Some("PATCH".into()));
        assert_eq!(
            decide(Method::POST, Some("GET")),
            None,
            "stays keyed as POST"
        );
        assert_eq!(decide(Method::POST, Some("post")), None);
        assert_eq!(decide(Method::GET, Some("DELETE")), Some("DELETE".into()));
        assert_eq!(decide(Method::GET, None), None);
        // No override headers configured: the method line alone.
        let (parts, ()) = http::Request::get("/")
            .header("x-http-method-override", "POST")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(decided_method(&keyed, &[], &parts), Ok(None));
    }
}
