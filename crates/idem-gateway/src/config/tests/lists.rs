//! How the per-route settings and the lists resolve: release statuses, tenant headers,
//! path normalisation and the route templates it applies to.

use super::*;

fn codes(c: &GatewayConfig) -> Vec<u16> {
    let set = c.release_statuses.as_ref().expect("a global list");
    set.iter().map(|s| s.as_u16()).collect()
}

#[test]
fn routes_may_release_their_own_statuses() {
    let file: ServeArgs = toml::from_str(
        r#"
        [[route]]
        path = "/v1/payouts"
        release_statuses = [503, 502]

        [[route]]
        path = "/v1/refunds"
        "#,
    )
    .unwrap();
    let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap();
    let route: Vec<u16> = c.routes[0]
        .release_statuses
        .as_ref()
        .expect("the route's own list")
        .iter()
        .map(|s| s.as_u16())
        .collect();
    assert_eq!(route, vec![502, 503]);
    assert!(
        c.routes[1].release_statuses.is_none(),
        "the global list applies"
    );

    let file: ServeArgs =
        toml::from_str("[[route]]\npath = \"/v1/x\"\nrelease_statuses = [204]").unwrap();
    let err = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("/v1/x") && text.contains("release_statuses") && text.contains("204: only"),
        "{text}"
    );
}

#[test]
fn release_statuses_default_to_each_routes_profiles() {
    let file: ServeArgs = toml::from_str(
        r#"
        profile = "acp"

        [[route]]
        path = "/v1/checkout"

        [[route]]
        path = "/v1/payments"
        profile = "stripe"

        [[route]]
        path = "/v1/orders"
        release_statuses = [409]
        "#,
    )
    .unwrap();
    let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap();
    assert!(c.release_statuses.is_none(), "no global list");
    let of = |i: usize| -> Vec<u16> {
        let set = c.release_statuses_of(&c.routes[i]);
        set.iter().map(|s| s.as_u16()).collect()
    };
    let mut acp = idem_tower::DEFAULT_RELEASE_STATUSES.to_vec();
    acp.extend(500..=599);
    acp.sort_unstable();
    acp.dedup();
    assert_eq!(of(0), acp, "acp releases every 5xx");
    assert_eq!(of(1), idem_tower::DEFAULT_RELEASE_STATUSES.to_vec());
    assert_eq!(of(2), vec![409], "a route's own list wins over its profile");

    let file: ServeArgs =
        toml::from_str("profile = \"acp\"\nrelease_statuses = [503]\n[[route]]\npath = \"/x\"")
            .unwrap();
    let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap();
    let set = c.release_statuses_of(&c.routes[0]);
    assert_eq!(
        set.iter().map(|s| s.as_u16()).collect::<Vec<_>>(),
        vec![503]
    );
}

#[test]
fn release_statuses_from_the_command_line_and_the_file() {
    let file = || -> ServeArgs { toml::from_str("release_statuses = [503, 409, 409]").unwrap() };
    let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file()).unwrap();
    assert_eq!(codes(&c), vec![409, 503], "sorted, without repeats");

    let mut cli = args("http://127.0.0.1:3000");
    cli.release_statuses = Some(vec![" 429".into(), "418".into(), "".into()]);
    let c = GatewayConfig::merge(&cli, file()).unwrap();
    assert_eq!(codes(&c), vec![418, 429], "the command line wins");

    for none in ["none", "NONE"] {
        cli.release_statuses = Some(vec![none.into()]);
        let c = GatewayConfig::merge(&cli, ServeArgs::default()).unwrap();
        assert!(codes(&c).is_empty());
    }
    let file: ServeArgs = toml::from_str("release_statuses = []").unwrap();
    let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap();
    assert!(codes(&c).is_empty());
}

#[test]
fn release_statuses_refuse_answers_that_mean_executed() {
    let mut cli = args("http://127.0.0.1:3000");
    for (list, says) in [
        (vec!["409", "200"], "200: only 4xx and 5xx"),
        (vec!["302"], "302: only 4xx and 5xx"),
        (vec!["600"], "600: only 4xx and 5xx"),
        (vec!["conflict"], "\"conflict\" is not a status code"),
        (vec!["none", "409"], "\"none\" is not a status code"),
        (vec![""], "the list is empty"),
        (vec![" ", ""], "the list is empty"),
    ] {
        cli.release_statuses = Some(list.iter().map(|s| s.to_string()).collect());
        let err = GatewayConfig::merge(&cli, ServeArgs::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("release_statuses") && text.contains(says),
            "{list:?}: {text}"
        );
    }
    let file: ServeArgs = toml::from_str("release_statuses = [201]").unwrap();
    let err = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap_err();
    assert!(err.to_string().contains("201: only 4xx and 5xx"), "{err}");
}

#[test]
fn tenant_headers_from_the_command_line_or_the_file_and_checked() {
    let file = |toml: &str| -> ServeArgs { toml::from_str(toml).unwrap() };
    let c = GatewayConfig::merge(
        &args("http://127.0.0.1:1"),
        file("tenant_header = [\"Authorization\", \"Stripe-Account\"]\nrequire_tenant = true"),
    )
    .unwrap();
    assert_eq!(
        c.tenant_headers,
        vec![
            http::header::AUTHORIZATION,
            HeaderName::from_static("stripe-account")
        ]
    );
    assert!(c.require_tenant);
    let c = GatewayConfig::merge(
        &args("http://127.0.0.1:1"),
        file("tenant_header = \"X-Api-Key, Stripe-Account\""),
    )
    .unwrap();
    assert_eq!(c.tenant_headers.len(), 2);
    let mut a = args("http://127.0.0.1:1");
    a.tenant_header = Some(vec!["x-api-key".into()]);
    let c = GatewayConfig::merge(&a, file("tenant_header = \"Authorization\"")).unwrap();
    assert_eq!(c.tenant_headers, vec![HeaderName::from_static("x-api-key")]);
    for (list, says) in [
        (vec!["", " "], "the list is empty"),
        (vec!["Authorization", "authorization"], "listed twice"),
        (vec!["bad header"], "\"bad header\""),
    ] {
        a.tenant_header = Some(list.iter().map(|s| s.to_string()).collect());
        let e = GatewayConfig::merge(&a, ServeArgs::default()).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("tenant_header") && text.contains(says),
            "{text}"
        );
    }
}

#[test]
fn path_normalization_from_the_command_line_the_file_or_the_default() {
    let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), ServeArgs::default()).unwrap();
    assert_eq!(c.path_normalization, PathNormalization::default());
    assert_eq!(
        c.path_normalization.to_string(),
        "rfc3986,merge-slashes,reject-ambiguous"
    );
    assert_eq!(c.route_matching, RouteMatching::default());
    let file: ServeArgs = toml::from_str("route_matching = \"exact\"").unwrap();
    let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap();
    assert_eq!(c.route_matching, RouteMatching::EXACT);
    let file: ServeArgs = toml::from_str("route_matching = \"exact,ignore-case\"").unwrap();
    let err = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap_err();
    assert!(err.to_string().contains("route_matching"), "{err}");
    for toml in [
        "path_normalization = [\"rfc3986\", \"lowercase\"]",
        "path_normalization = \"rfc3986,lowercase\"",
    ] {
        let file: ServeArgs = toml::from_str(toml).unwrap();
        let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap();
        assert_eq!(
            c.path_normalization.to_string(),
            "rfc3986,lowercase",
            "{toml}"
        );
    }
    let file = || -> ServeArgs { toml::from_str("path_normalization = \"none\"").unwrap() };
    let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file()).unwrap();
    assert!(c.path_normalization.is_none());
    let mut cli = args("http://127.0.0.1:3000");
    cli.path_normalization = Some(vec!["merge-slashes".into(), "trailing-slash".into()]);
    let c = GatewayConfig::merge(&cli, file()).unwrap();
    assert_eq!(
        c.path_normalization.to_string(),
        "merge-slashes,trailing-slash",
        "the command line wins"
    );
}

#[test]
fn route_paths_are_written_as_the_normal_paths_they_match() {
    let file = |normalization: &str, path: &str| -> ServeArgs {
        toml::from_str(&format!(
            "path_normalization = \"{normalization}\"\n[[route]]\npath = \"{path}\""
        ))
        .unwrap()
    };
    let a = args("http://127.0.0.1:3000");
    for (normalization, path, says) in [
        (
            "rfc3986,merge-slashes",
            "/v1//charges",
            "write it /v1/charges",
        ),
        ("rfc3986", "/v1/%63harges", "write it /v1/charges"),
        (
            "rfc3986",
            "/v1/orders/{id}/./capture",
            "write it /v1/orders/{id}/capture",
        ),
        ("rfc3986", "/v1/a%2fb", "write it /v1/a%2Fb"),
        ("rfc3986", "/../v1", "climbs above the root"),
        (
            "rfc3986,lowercase",
            "/V1/Orders/{Id}",
            "write it /v1/orders/{Id}",
        ),
        (
            "rfc3986,trailing-slash",
            "/v1/charges/",
            "write it /v1/charges",
        ),
    ] {
        let err = GatewayConfig::merge(&a, file(normalization, path)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("route[0] ({path})"))
                && text.contains("never matches")
                && text.contains(says),
            "{normalization} {path}: {text}"
        );
    }
    for (normalization, path) in [
        ("rfc3986,merge-slashes", "/v1/orders/{id}/capture"),
        ("rfc3986,merge-slashes", "/v1/charges/"),
        ("rfc3986,merge-slashes", "/files/{*rest}"),
        ("rfc3986,merge-slashes", "/v1/a%2Fb"),
        ("none", "/V1//%63harges/./"),
    ] {
        let c = GatewayConfig::merge(&a, file(normalization, path));
        assert!(c.is_ok(), "{normalization} {path}: {c:?}");
    }
}

#[test]
fn path_normalization_refuses_what_it_cannot_use() {
    let mut cli = args("http://127.0.0.1:3000");
    for (list, says) in [
        (
            vec!["rfc3986", "dedupe"],
            "\"dedupe\" is not a normalisation",
        ),
        (vec!["none", "rfc3986"], "cannot be given with other items"),
        (vec![""], "the list is empty"),
    ] {
        cli.path_normalization = Some(list.iter().map(|s| s.to_string()).collect());
        let err = GatewayConfig::merge(&cli, ServeArgs::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("path_normalization") && text.contains(says),
            "{list:?}: {text}"
        );
    }
    let file: ServeArgs = toml::from_str("path_normalization = []").unwrap();
    let err = GatewayConfig::merge(&args("http://127.0.0.1:3000"), file).unwrap_err();
    assert!(err.to_string().contains("the list is empty"), "{err}");
}

#[tokio::test]
async fn a_release_list_that_contradicts_its_profile_is_warned_of() {
    let file: ServeArgs = toml::from_str(
        r#"
        upstream = "http://127.0.0.1:1"
        profile = "acp"
        release_statuses = [409]

        [[route]]
        path = "/v1/payments"
        profile = "stripe"

        [[route]]
        path = "/v1/refunds"
        profile = "ietf"
        release_statuses = [500]

        [[route]]
        path = "/v1/checkout"
        release_statuses = [409, 500]
        "#,
    )
    .unwrap();
    let c = GatewayConfig::merge(&ServeArgs::default(), file).unwrap();
    let warnings = c.warnings().await;
    let releases = |w: &&String| w.contains("release_statuses");
    let warnings: Vec<&String> = warnings.iter().filter(releases).collect();
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(
        warnings[0].starts_with("release_statuses under the acp profile records an upstream 500"),
        "{warnings:?}"
    );
    // The global list under the route's own profile says nothing against it.
    assert!(
        warnings[1].starts_with(
            "the route /v1/refunds's release_statuses under the ietf profile releases an upstream 500"
        ),
        "{warnings:?}"
    );
    assert!(
        warnings[2].starts_with(
            "the route /v1/checkout's release_statuses under the acp profile records an upstream 501 and others"
        ),
        "{warnings:?}"
    );
}
