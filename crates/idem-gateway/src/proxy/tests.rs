//! Tests of `proxy.rs`.

use http_body_util::Full;

use super::*;

#[test]
fn resource_header_is_read_and_stripped_and_must_be_one_path() {
    let cases: [(&[&str], Option<&str>); 6] = [
        (&["/v1/reports/42"], Some("/v1/reports/42")),
        (
            &["/v1/reports?id=42&f=csv"],
            Some("/v1/reports?id=42&f=csv"),
        ),
        (&["https://elsewhere.example/x"], None),
        (&["//elsewhere.example/x"], None),
        (&["reports/42"], None),
        (&["/a", "/b"], None),
    ];
    for (values, expected) in cases {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(RESOURCE_HEADER, HeaderValue::from_str(v).unwrap());
        }
        let got = take_reference(&mut h);
        assert_eq!(got.as_ref().map(|r| r.as_str()), expected, "{values:?}");
        assert!(h.is_empty(), "stripped: {values:?}");
    }
}

#[test]
fn disposition_header_is_read_and_stripped() {
    let mut h = HeaderMap::new();
    h.insert(DISPOSITION_HEADER, HeaderValue::from_static("Release"));
    assert_eq!(take_disposition(&mut h), Some(Disposition::Release));
    assert!(h.get(DISPOSITION_HEADER).is_none());

    h.insert(DISPOSITION_HEADER, HeaderValue::from_static("record"));
    assert_eq!(take_disposition(&mut h), Some(Disposition::Record));

    h.insert(DISPOSITION_HEADER, HeaderValue::from_static("maybe"));
    assert_eq!(take_disposition(&mut h), None);
    assert!(
        h.get(DISPOSITION_HEADER).is_none(),
        "stripped even when unknown"
    );

    assert_eq!(take_disposition(&mut h), None);
}

async fn upstream(delay: Duration, extra: Option<(&'static str, &'static str)>) -> String {
    use axum::http::StatusCode;
    let app = axum::Router::new().fallback(move || async move {
        tokio::time::sleep(delay).await;
        let mut res = axum::response::IntoResponse::into_response((
            StatusCode::CREATED,
            [("connection", "keep-alive"), ("keep-alive", "timeout=5")],
            "made",
        ));
        if let Some((k, v)) = extra {
            res.headers_mut().insert(k, HeaderValue::from_static(v));
        }
        res
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// A proxy to the `http://` upstream at `url` over HTTP/1.1.
fn proxy(url: &str, timeout: Duration) -> Proxy {
    Proxy::speaking(
        Upstream::parse(url).unwrap(),
        UpstreamProtocol::Http1,
        None,
        timeout,
        Arc::new(Metrics::new()),
    )
}

fn request() -> Request<Full<Bytes>> {
    Request::post("/v1/x")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

#[tokio::test]
async fn answer_streams_back_without_hop_by_hop_headers() {
    let p = proxy(
        &upstream(Duration::ZERO, None).await,
        Duration::from_secs(5),
    );
    let res = p.forward(request()).await.expect("an answer");
    assert_eq!(res.status(), 201);
    assert!(res.headers().get("keep-alive").is_none());
    assert!(res.extensions().get::<Disposition>().is_none());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"made");
}

#[tokio::test]
async fn disposition_header_becomes_the_extension() {
    let url = upstream(Duration::ZERO, Some(("idempotency-disposition", "release"))).await;
    let res = proxy(&url, Duration::from_secs(5))
        .forward(request())
        .await
        .expect("an answer");
    assert_eq!(
        res.extensions().get::<Disposition>(),
        Some(&Disposition::Release)
    );
    assert!(res.headers().get(DISPOSITION_HEADER).is_none());
}

#[tokio::test]
async fn refused_connection_is_502_release() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = proxy(&format!("http://127.0.0.1:{port}"), Duration::from_secs(5));
    let failed = p.forward(request()).await.expect_err("no answer");
    assert_eq!(failed, ForwardError::Upstream(UpstreamFailure::Unreachable));
    assert_eq!(failed.problem().status(), 502);
    assert_eq!(
        UpstreamFailure::Unreachable.disposition(),
        Disposition::Release
    );
    // Counted where it is answered, once: the black-box test of an unreachable
    // upstream reads `idem_upstream_errors_total{kind="unreachable"}`.
}

#[tokio::test]
async fn slow_upstream_is_504_keep_in_progress() {
    let url = upstream(Duration::from_secs(3), None).await;
    let failed = proxy(&url, Duration::from_millis(200))
        .forward(request())
        .await
        .expect_err("no answer in time");
    assert_eq!(failed, ForwardError::Upstream(UpstreamFailure::Timeout));
    assert_eq!(failed.problem().status(), 504);
    assert_eq!(
        UpstreamFailure::Timeout.disposition(),
        Disposition::KeepInProgress
    );
}
