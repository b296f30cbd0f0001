use super::*;
use idem_core::MemoryStore;

#[test]
fn token_compare_is_exact() {
    assert!(token_matches(b"abc", b"abc"));
    assert!(!token_matches(b"abc", b"abd"));
    assert!(!token_matches(b"abc", b"abcd"));
    assert!(!token_matches(b"", b"abc"));
    assert!(!token_matches(b"ABC", b"abc"));
}

#[test]
fn bearer_scheme_is_matched_in_any_case() {
    for value in [
        "Bearer s3cret",
        "bearer s3cret",
        "BEARER s3cret",
        "bEaReR   s3cret ",
    ] {
        assert_eq!(bearer_token(value), Some("s3cret"), "{value:?}");
    }
    for value in [
        "Basic s3cret",
        "Bearer",
        "Bearer ",
        "Bearers3cret",
        "s3cret",
    ] {
        assert_eq!(bearer_token(value), None, "{value:?}");
    }
}

async fn serve(token: Option<&str>) -> (String, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let access = AdminAccess {
        token: token.map(Arc::from),
        open: false,
    };
    let state = AdminState {
        store: store.clone(),
        metrics: Arc::new(Metrics::new()),
        access: access.shared(),
        reloader: None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    (format!("http://{addr}"), store)
}

async fn get_status(url: &str, token: Option<&str>) -> u16 {
    use http_body_util::Empty;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let mut req = http::Request::get(url);
    if let Some(t) = token {
        let value = if t.contains(' ') {
            t.to_owned()
        } else {
            format!("Bearer {t}")
        };
        req = req.header("authorization", value);
    }
    client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn without_a_token_records_are_closed_and_metrics_served() {
    let (base, _store) = serve(None).await;
    assert_eq!(get_status(&format!("{base}/healthz"), None).await, 200);
    assert_eq!(get_status(&format!("{base}/metrics"), None).await, 200);
    assert_eq!(get_status(&format!("{base}/keys"), None).await, 403);
    assert_eq!(get_status(&format!("{base}/keys?key=k"), None).await, 403);
}

#[test]
fn a_browser_request_from_another_site_is_told_apart() {
    let req = |headers: &[(&str, &str)]| {
        let mut r = http::Request::get("http://127.0.0.1:9090/reload");
        for (name, value) in headers {
            r = r.header(*name, *value);
        }
        r.body(axum::body::Body::empty()).unwrap()
    };
    let host = ("host", "127.0.0.1:9090");
    for ok in [
        vec![host],
        vec![host, ("sec-fetch-site", "same-origin")],
        vec![host, ("sec-fetch-site", "none")],
        vec![host, ("origin", "http://127.0.0.1:9090")],
        vec![host, ("origin", "https://127.0.0.1:9090")],
    ] {
        assert_eq!(cross_site(&req(&ok)), None, "{ok:?}");
    }
    for refused in [
        vec![host, ("sec-fetch-site", "cross-site")],
        vec![host, ("sec-fetch-site", "same-site")],
        vec![host, ("origin", "http://localhost:9090")],
        vec![host, ("origin", "http://127.0.0.1:3000")],
        vec![host, ("origin", "null")],
    ] {
        assert!(cross_site(&req(&refused)).is_some(), "{refused:?}");
    }
}

#[tokio::test]
async fn token_protects_all_but_probes() {
    let (base, _store) = serve(Some("s3cret")).await;
    assert_eq!(get_status(&format!("{base}/healthz"), None).await, 200);
    assert_eq!(get_status(&format!("{base}/readyz"), None).await, 200);
    assert_eq!(get_status(&format!("{base}/metrics"), None).await, 401);
    assert_eq!(
        get_status(&format!("{base}/metrics"), Some("wrong")).await,
        401
    );
    assert_eq!(
        get_status(&format!("{base}/metrics"), Some("s3cret")).await,
        200
    );
    assert_eq!(
        get_status(&format!("{base}/keys?key=nope"), Some("s3cret")).await,
        404
    );
    // The scheme in any case (RFC 9110 §11.1); the token exactly.
    for value in ["bearer s3cret", "BEARER  s3cret"] {
        assert_eq!(
            get_status(&format!("{base}/metrics"), Some(value)).await,
            200,
            "{value}"
        );
    }
    assert_eq!(
        get_status(&format!("{base}/metrics"), Some("bearer S3CRET")).await,
        401
    );
}
