//! How the settings resolve: precedence, defaults, and what is refused.

use http::{HeaderName, Method};
use idem_core::ScopeMode;

use super::*;
use crate::path::PathNormalization;
use crate::route::RouteMatching;

mod declared;
mod lists;

fn args(upstream: &str) -> ServeArgs {
    ServeArgs {
        upstream: Some(upstream.to_owned()),
        ..ServeArgs::default()
    }
}

#[test]
fn defaults_follow_the_issue() {
    let c = GatewayConfig::merge(&args("http://127.0.0.1:3000"), ServeArgs::default()).unwrap();
    assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.store, "sqlite://idem.db");
    assert_eq!(c.admin, None);
    assert!(!c.require_key);
    assert_eq!(c.ttl, Duration::from_secs(24 * 3600));
    assert_eq!(c.lease, Duration::from_secs(60));
    assert_eq!(c.upstream_timeout, Duration::from_secs(60));
    assert_eq!(c.body_limit, 1024 * 1024);
    assert_eq!(c.response_limit, 8 * 1024 * 1024);
    assert_eq!(c.tenant_headers, vec![http::header::AUTHORIZATION]);
    assert!(!c.require_tenant);
    assert!(c.tenant_key.is_none(), "the store's own secret");
    assert_eq!(c.scope, ScopeMode::Public);
    assert_eq!(c.keyed_methods, vec![Method::POST, Method::PATCH]);
    assert_eq!(c.client_timeout, Some(Duration::from_secs(30)));
    assert_eq!(c.store_options.namespace, None, "the stores' own: idem");
}

#[test]
fn settings_that_would_disable_protection_are_refused() {
    let zero = Some(Duration::ZERO);
    let cases: [(&str, ServeArgs); 6] = [
        (
            "lease",
            ServeArgs {
                lease: zero,
                ..args("http://127.0.0.1:1")
            },
        ),
        (
            "ttl",
            ServeArgs {
                ttl: zero,
                ..args("http://127.0.0.1:1")
            },
        ),
        (
            "upstream_timeout",
            ServeArgs {
                upstream_timeout: zero,
                ..args("http://127.0.0.1:1")
            },
        ),
        (
            "sweep_interval",
            ServeArgs {
                sweep_interval: zero,
                ..args("http://127.0.0.1:1")
            },
        ),
        (
            "keyed_methods",
            ServeArgs {
                keyed_methods: Some(vec![]),
                ..args("http://127.0.0.1:1")
            },
        ),
        (
            "keyed_methods",
            ServeArgs {
                keyed_methods: Some(vec![" ".into(), "".into()]),
                ..args("http://127.0.0.1:1")
            },
        ),
    ];
    for (setting, a) in cases {
        let e = GatewayConfig::merge(&a, ServeArgs::default()).unwrap_err();
        assert!(e.to_string().contains(setting), "{setting}: {e}");
    }
    for file in [
        "upstream = \"http://127.0.0.1:1\"\nsweep_interval = \"0s\"",
        "upstream = \"http://127.0.0.1:1\"\n[[route]]\npath = \"/x\"\nttl = \"0s\"",
    ] {
        let file: ServeArgs = toml::from_str(file).unwrap();
        let e = GatewayConfig::merge(&ServeArgs::default(), file).unwrap_err();
        assert!(e.to_string().contains("longer than zero"), "{e}");
    }
}

#[test]
fn store_namespace_from_the_command_line_or_the_file_and_checked() {
    let file = |ns: &str| -> ServeArgs {
        toml::from_str(&format!(
            "upstream = \"http://127.0.0.1:1\"\nstore_namespace = \"{ns}\""
        ))
        .unwrap()
    };
    let c = GatewayConfig::merge(&ServeArgs::default(), file("payments")).unwrap();
    let ns = c.store_options.namespace.unwrap();
    assert_eq!(
        (
            ns.suffixed("_records").unwrap().to_string(),
            format!("{ns}:")
        ),
        ("payments_records".into(), "payments:".into())
    );
    let a = ServeArgs {
        store_namespace: Some("orders".into()),
        ..ServeArgs::default()
    };
    let c = GatewayConfig::merge(&a, file("payments")).unwrap();
    assert_eq!(c.store_options.namespace.unwrap().as_str(), "orders");
    let e = GatewayConfig::merge(&ServeArgs::default(), file("pay-ments")).unwrap_err();
    let shown = e.to_string();
    assert!(
        shown.contains("store_namespace") && shown.contains("\"pay-ments\" is not a namespace"),
        "{shown}"
    );
}

#[test]
fn client_timeout_from_the_file_the_command_line_or_off() {
    let file = || -> ServeArgs {
        toml::from_str("upstream = \"http://127.0.0.1:1\"\nclient_timeout = \"5s\"").unwrap()
    };
    let c = GatewayConfig::merge(&ServeArgs::default(), file()).unwrap();
    assert_eq!(c.client_timeout, Some(Duration::from_secs(5)));
    let mut a = ServeArgs {
        client_timeout: Some(Duration::from_millis(1500)),
        ..ServeArgs::default()
    };
    let c = GatewayConfig::merge(&a, file()).unwrap();
    assert_eq!(c.client_timeout, Some(Duration::from_millis(1500)));
    a.client_timeout = Some(Duration::ZERO);
    let c = GatewayConfig::merge(&a, file()).unwrap();
    assert_eq!(c.client_timeout, None, "0s turns it off");
}

#[test]
fn max_connections_from_the_file_or_the_command_line_and_never_zero() {
    let file = |n: u32| -> ServeArgs {
        toml::from_str(&format!(
            "upstream = \"http://127.0.0.1:1\"\nmax_connections = {n}"
        ))
        .unwrap()
    };
    let bare: ServeArgs = toml::from_str("upstream = \"http://127.0.0.1:1\"").unwrap();
    let c = GatewayConfig::merge(&ServeArgs::default(), bare).unwrap();
    assert_eq!(c.max_connections, None, "derived when the gateway binds");
    let c = GatewayConfig::merge(&ServeArgs::default(), file(300)).unwrap();
    assert_eq!(c.max_connections, Some(300));
    let a = ServeArgs {
        max_connections: Some(4),
        ..ServeArgs::default()
    };
    assert_eq!(
        GatewayConfig::merge(&a, file(300)).unwrap().max_connections,
        Some(4)
    );
    let e = GatewayConfig::merge(&ServeArgs::default(), file(0)).unwrap_err();
    assert!(e.to_string().contains("max_connections"), "{e}");
}

#[test]
fn missing_upstream_is_an_error_that_says_how() {
    let err = GatewayConfig::merge(&ServeArgs::default(), ServeArgs::default()).unwrap_err();
    assert!(err.to_string().contains("--upstream"), "{err}");
}

#[test]
fn command_line_wins_over_file() {
    let file: ServeArgs = toml::from_str(
        r#"
        upstream = "http://127.0.0.1:1"
        ttl = "1h"
        lease = "5s"
        body_limit = "64KiB"
        response_limit = 2097152
        keyed_methods = ["POST"]
        "#,
    )
    .unwrap();
    let mut a = args("http://127.0.0.1:2/api/");
    a.ttl = Some(Duration::from_secs(60));
    let c = GatewayConfig::merge(&a, file).unwrap();
    assert_eq!(c.upstream.authority.as_str(), "127.0.0.1:2");
    assert_eq!(c.upstream.base_path, "/api");
    assert_eq!(c.ttl, Duration::from_secs(60));
    assert_eq!(c.lease, Duration::from_secs(5));
    assert_eq!(c.body_limit, 64 * 1024);
    assert_eq!(c.response_limit, 2 * 1024 * 1024);
    assert_eq!(c.keyed_methods, vec![Method::POST]);
}

#[test]
fn file_routes_are_checked() {
    let file: ServeArgs = toml::from_str(
        r#"
        upstream = "http://127.0.0.1:1"
        [[route]]
        method = "post"
        path = "/v1/orders/{id}/capture"
        require_key = true
        ttl = "1h"
        ignore = ["/client_sent_at"]
        store_headers = ["X-Order-Id"]
        "#,
    )
    .unwrap();
    let c = GatewayConfig::merge(&ServeArgs::default(), file).unwrap();
    let r = &c.routes[0];
    assert_eq!(r.method, Some(Method::POST));
    assert_eq!(r.require_key, Some(true));
    assert_eq!(r.ttl, Some(Duration::from_secs(3600)));
    assert_eq!(r.store_headers, vec![HeaderName::from_static("x-order-id")]);
    assert!(r.matches(&Method::POST, "/v1/orders/9/capture"));

    let bad: ServeArgs = toml::from_str(
        r#"
        upstream = "http://127.0.0.1:1"
        [[route]]
        path = "/x"
        ignore = ["no-slash"]
        "#,
    )
    .unwrap();
    assert!(GatewayConfig::merge(&ServeArgs::default(), bad).is_err());
}

#[test]
fn unknown_file_keys_are_rejected() {
    assert!(toml::from_str::<ServeArgs>("upstreem = \"x\"").is_err());
}

fn with_token_file(contents: &str) -> (tempfile::TempDir, ServeArgs) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin-token");
    std::fs::write(&path, contents).unwrap();
    let a = ServeArgs {
        admin_token_file: Some(path),
        ..args("http://127.0.0.1:1")
    };
    (dir, a)
}

#[test]
fn admin_token_file_is_read_without_its_line_end() {
    for contents in ["s3cret\n", "s3cret\r\n", "s3cret"] {
        let (_dir, a) = with_token_file(contents);
        let c = GatewayConfig::merge(&a, ServeArgs::default()).unwrap();
        assert_eq!(c.admin_token.as_deref(), Some("s3cret"), "{contents:?}");
    }
    // The TOML key names the file too.
    let (dir, _) = with_token_file("from-toml\n");
    let path = dir.path().join("admin-token");
    let file: ServeArgs = toml::from_str(&format!(
        "admin_token_file = {:?}",
        path.display().to_string()
    ))
    .unwrap();
    let c = GatewayConfig::merge(&args("http://127.0.0.1:1"), file).unwrap();
    assert_eq!(c.admin_token.as_deref(), Some("from-toml"));
}

#[test]
fn admin_token_and_token_file_together_are_refused() {
    let (_dir, a) = with_token_file("one\n");
    let a = ServeArgs {
        admin_token: Some("two".into()),
        ..a
    };
    let e = GatewayConfig::merge(&a, ServeArgs::default()).unwrap_err();
    assert!(e.to_string().contains("admin_token_file"), "{e}");
    // Wherever each comes from.
    let (_dir, a) = with_token_file("one\n");
    let file: ServeArgs = toml::from_str("admin_token = \"two\"").unwrap();
    let e = GatewayConfig::merge(&a, file).unwrap_err();
    assert!(e.to_string().contains("admin_token_file"), "{e}");
}

#[test]
fn empty_admin_token_is_refused() {
    for token in ["", "   ", "\t"] {
        let a = ServeArgs {
            admin_token: Some(token.into()),
            ..args("http://127.0.0.1:1")
        };
        let e = GatewayConfig::merge(&a, ServeArgs::default()).unwrap_err();
        assert!(e.to_string().contains("empty"), "{token:?}: {e}");
    }
    for contents in ["", "\n", "  \n\n", "\r\n"] {
        let (_dir, a) = with_token_file(contents);
        let e = GatewayConfig::merge(&a, ServeArgs::default()).unwrap_err();
        assert!(e.to_string().contains("empty"), "{contents:?}: {e}");
    }
    // A token a bearer header cannot carry as it is would lock every caller out.
    for token in [" s3cret", "s3cret ", "s3c\u{7f}ret", "sécret"] {
        let a = ServeArgs {
            admin_token: Some(token.into()),
            ..args("http://127.0.0.1:1")
        };
        assert!(
            GatewayConfig::merge(&a, ServeArgs::default()).is_err(),
            "{token:?}"
        );
    }
}

#[test]
fn unreadable_admin_token_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = ServeArgs {
        admin_token_file: Some(dir.path().join("missing")),
        ..args("http://127.0.0.1:1")
    };
    let e = GatewayConfig::merge(&a, ServeArgs::default()).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn a_misspelled_key_in_the_file_gets_the_nearest_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.toml");
    for (text, near) in [
        (
            "upstream = \"http://127.0.0.1:1\"\nttll = \"2h\"\n",
            Some("ttl"),
        ),
        (
            "upstream = \"http://127.0.0.1:1\"\nmax_waiter = 3\n",
            Some("max_waiters"),
        ),
        (
            "upstream = \"http://127.0.0.1:1\"\n[[route]]\nmethod = \"POST\"\npath = \"/v1\"\nrequire_kye = true\n",
            Some("require_key"),
        ),
        (
            "upstream = \"http://127.0.0.1:1\"\ncolour = \"blue\"\n",
            None,
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let e = read_file(&path).unwrap_err().to_string();
        match near {
            Some(near) => assert!(e.contains(&format!("did you mean `{near}`?")), "{e}"),
            None => assert!(!e.contains("did you mean"), "{e}"),
        }
    }
}

/// `ttl = 3600` in the file is refused with how durations are written, not serde's
/// "invalid type: integer, expected a string"; the quoted form reads.
#[test]
fn a_bare_number_for_a_duration_says_how_durations_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.toml");
    for (text, number) in [
        ("upstream = \"http://127.0.0.1:1\"\nttl = 3600\n", "3600"),
        ("upstream = \"http://127.0.0.1:1\"\nlease = 1.5\n", "1.5"),
        (
            "upstream = \"http://127.0.0.1:1\"\n[[route]]\npath = \"/v1\"\nttl = 60\n",
            "60",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let e = read_file(&path).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "{number} is a bare number; a duration is a string with its unit: \"{number}s\", \"1h\""
            )),
            "{e}"
        );
        assert!(!e.contains("invalid type"), "{e}");
    }
    std::fs::write(
        &path,
        "upstream = \"http://127.0.0.1:1\"\nttl = \"3600s\"\n",
    )
    .unwrap();
    let file = read_file(&path).unwrap();
    assert_eq!(file.ttl, Some(std::time::Duration::from_secs(3600)));
}

#[tokio::test]
async fn settings_that_defeat_themselves_are_warned_of() {
    let args = |extra: &str| -> ServeArgs {
        toml::from_str(&format!("upstream = \"http://127.0.0.1:1\"\n{extra}")).unwrap()
    };
    let quiet = GatewayConfig::merge(&ServeArgs::default(), args("")).unwrap();
    assert_eq!(quiet.warnings().await, Vec::<String>::new());
    let c = GatewayConfig::merge(
        &ServeArgs::default(),
        args("ttl = \"30s\"\nlease = \"60s\"\nmax_wait = \"90s\""),
    )
    .unwrap();
    let warnings = c.warnings().await;
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].starts_with("ttl 30s is shorter than the lease 1m"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].starts_with("max_wait 1m 30s is longer"),
        "{warnings:?}"
    );
    // A lease the store's own timeout could use up: a slow reserve would be refused.
    let shared = |lease: &str| {
        let store = "store = \"postgres://u@127.0.0.1/test\"";
        GatewayConfig::merge(&ServeArgs::default(), args(&format!("{store}\n{lease}"))).unwrap()
    };
    let warnings = shared("lease = \"8s\"\nmax_wait = \"8s\"").warnings().await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0]
            .starts_with("lease 8s is not comfortably above the store's operation timeout 5s"),
        "{warnings:?}"
    );
    assert!(warnings[0].contains("reservation-late"), "{warnings:?}");
    assert_eq!(
        shared("lease = \"11s\"\nmax_wait = \"11s\"")
            .warnings()
            .await,
        Vec::<String>::new()
    );
    let unknown: ServeArgs =
        toml::from_str("upstream = \"http://no-such-host.invalid:80\"").unwrap();
    let c = GatewayConfig::merge(&ServeArgs::default(), unknown).unwrap();
    let warnings = c.warnings().await;
    assert!(
        warnings.iter().any(|w| w.contains("no-such-host.invalid")),
        "{warnings:?}"
    );
}

#[test]
fn each_setting_layers_by_its_type() {
    use std::time::Duration;
    let file = ServeArgs {
        upstream: Some("http://file".into()),
        ttl: Some(Duration::from_secs(60)),
        require_key: true,
        route: vec![toml::from_str("path = \"/file\"").unwrap()],
        ..ServeArgs::default()
    };
    let command_line = ServeArgs {
        upstream: Some("http://flag".into()),
        passthrough: true,
        ..ServeArgs::default()
    };
    let layered = command_line.over(file);
    // A value given above wins; one given only beneath stays.
    assert_eq!(layered.upstream.as_deref(), Some("http://flag"));
    assert_eq!(layered.ttl, Some(Duration::from_secs(60)));
    // A switch is on when either layer turns it on.
    assert!(layered.require_key && layered.passthrough);
    assert!(!layered.no_migrate);
    // Tables come from the layer that has any.
    assert_eq!(layered.route.len(), 1);
    assert_eq!(layered.route[0].path, "/file");
    let routes_above = ServeArgs {
        route: vec![toml::from_str("path = \"/above\"").unwrap()],
        ..ServeArgs::default()
    };
    let layered = routes_above.over(layered);
    assert_eq!(layered.route.len(), 1);
    assert_eq!(layered.route[0].path, "/above");
}
