//! Tests of `route.rs`.

use super::*;

#[test]
fn route_matching_defaults_to_any_case_and_trailing_slash() {
    let default = RouteMatching::default();
    assert_eq!(default.to_string(), "ignore-case,ignore-trailing-slash");
    assert!(default.ignore_case && default.ignore_trailing_slash);
    assert_eq!(
        "exact".parse::<RouteMatching>().unwrap(),
        RouteMatching::EXACT
    );
    assert!("exact,ignore-case".parse::<RouteMatching>().is_err());
}

#[test]
fn template_matches_one_segment_per_placeholder() {
    let t = PathTemplate::parse("/v1/orders/{id}/capture").unwrap();
    assert!(t.matches_as("/v1/orders/42/capture", RouteMatching::EXACT));
    assert!(!t.matches_as("/v1/orders//capture", RouteMatching::EXACT));
    assert!(!t.matches_as("/v1/orders/42/capture/extra", RouteMatching::EXACT));
    assert!(!t.matches_as("/v1/orders/42", RouteMatching::EXACT));
    assert!(!t.matches_as("/v1/orders/42/refund", RouteMatching::EXACT));
}

#[test]
fn rest_placeholder_matches_the_tail() {
    let t = PathTemplate::parse("/files/{*path}").unwrap();
    assert!(t.matches_as("/files/a/b/c", RouteMatching::EXACT));
    assert!(t.matches_as("/files/", RouteMatching::EXACT));
    assert!(!t.matches_as("/other/a", RouteMatching::EXACT));
    assert!(PathTemplate::parse("/files/{*path}/x").is_err());
}

#[test]
fn malformed_templates_are_rejected() {
    assert!(PathTemplate::parse("v1/orders").is_err());
    assert!(PathTemplate::parse("/v1/{}").is_err());
    assert!(PathTemplate::parse("/v1/x{id}").is_err());
}

#[test]
fn first_matching_rule_wins_and_method_filters() {
    let r = |m: Option<Method>, t: &str| {
        Route::new(
            m,
            PathTemplate::parse(t).unwrap(),
            None,
            None,
            vec![],
            vec![],
            None,
        )
        .unwrap()
    };
    let routes = vec![
        r(Some(Method::POST), "/v1/orders/{id}"),
        r(None, "/v1/{*rest}"),
    ];
    assert_eq!(
        find(&routes, &Method::POST, "/v1/orders/7")
            .unwrap()
            .template
            .as_str(),
        "/v1/orders/{id}"
    );
    assert_eq!(
        find(&routes, &Method::PATCH, "/v1/orders/7")
            .unwrap()
            .template
            .as_str(),
        "/v1/{*rest}"
    );
    assert!(find(&routes, &Method::POST, "/v2/x").is_none());
}

/// `[[route]] method = "POST"` holds for `post` and `PoSt` too, which upstream
/// frameworks run as `POST`: a rule cannot be sidestepped by spelling.
#[test]
fn rule_method_matches_in_any_case() {
    let t = PathTemplate::parse("/v1/charges").unwrap();
    let rule = Route::new(
        Some(Method::POST),
        t,
        Some(true),
        None,
        vec![],
        vec![],
        None,
    )
    .unwrap();
    for spelling in ["POST", "post", "PoSt"] {
        let method = Method::from_bytes(spelling.as_bytes()).unwrap();
        assert!(rule.matches(&method, "/v1/charges"), "{spelling}");
    }
    assert!(!rule.matches(&Method::PUT, "/v1/charges"));
    assert!(!rule.matches(&Method::from_bytes(b"posts").unwrap(), "/v1/charges"));
}

/// By default a template matches its path in any case and with trailing slashes,
/// and `;` path parameters are never part of a segment; the canonical spelling
/// keeps the placeholders' values.
#[test]
fn templates_match_the_spellings_frameworks_route_to_them() {
    let t = PathTemplate::parse("/v1/orders/{id}/capture").unwrap();
    let default = RouteMatching::default();
    for path in [
        "/v1/orders/Ab1/capture",
        "/V1/ORDERS/Ab1/Capture",
        "/v1/orders/Ab1/capture/",
        "/v1/orders/Ab1/capture//",
        "/v1;x=1/orders/Ab1;v=2/capture;jsessionid=3",
    ] {
        assert!(t.matches_as(path, default), "{path}");
        assert_eq!(
            t.canonical(path, default).as_deref().unwrap_or(path),
            "/v1/orders/Ab1/capture",
            "{path}"
        );
    }
    assert!(!t.matches_as("/v1/orders//capture", default));
    assert!(!t.matches_as("/v1/orders/;x/capture", default));
    assert!(!t.matches_as("/V1/Orders/1/capture", RouteMatching::EXACT));
    assert!(!t.matches_as("/v1/orders/1/capture/", RouteMatching::EXACT));
    assert!(t.matches_as("/v1/orders/1/capture;x", RouteMatching::EXACT));
    let root = PathTemplate::parse("/").unwrap();
    assert!(root.matches_as("/", default) && root.matches_as("//", default));
    assert_eq!(root.canonical("/", default), None);
    let rest = PathTemplate::parse("/Files/{*path}").unwrap();
    assert_eq!(
        rest.canonical("/files/a/B;c/", default).as_deref(),
        Some("/Files/a/B;c")
    );
    assert!(PathTemplate::parse("/v1/a;b").is_err());
}

#[test]
fn bad_ignored_pointer_is_rejected() {
    let t = PathTemplate::parse("/x").unwrap();
    assert!(Route::new(None, t, None, None, vec!["nope".into()], vec![], None).is_err());
}
