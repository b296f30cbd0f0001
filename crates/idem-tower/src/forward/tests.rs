//! Tests of `forward.rs`: a proxy's failures, as their problems say. How the layer
//! answers them: `tests/execution.rs`.

use http::header;

use super::*;
use crate::Disposition;

#[test]
fn a_broken_client_body_is_the_clients_400() {
    let res = ForwardError::ClientBody.problem().to_response();
    assert_eq!(res.status(), 400);
    let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
    assert_eq!(v["type"], "https://idem.dev/problems/body-unreadable");
    assert_eq!(ForwardError::ClientBody.upstream_failure(), None);
}

#[test]
fn a_tls_failure_is_an_unreachable_upstream_naming_it() {
    let e = ForwardError::UpstreamTls("invalid peer certificate: UnknownIssuer".into());
    assert_eq!(e.upstream_failure(), Some(UpstreamFailure::Tls));
    let res = e.problem().to_response();
    assert_eq!(res.status(), 502);
    assert_eq!(
        e.upstream_failure().map(UpstreamFailure::disposition),
        Some(Disposition::Release)
    );
    let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
    assert_eq!(v["type"], "https://idem.dev/problems/upstream-unreachable");
    let detail = v["detail"].as_str().unwrap();
    assert!(
        detail.contains("TLS") && detail.contains("UnknownIssuer"),
        "{detail}"
    );
}

fn upstream(failure: UpstreamFailure) -> Response<bytes::Bytes> {
    ForwardError::Upstream(failure).problem().to_response()
}

#[test]
fn unreachable_is_502_and_releases() {
    let res = upstream(UpstreamFailure::Unreachable);
    assert_eq!(res.status(), 502);
    assert_eq!(
        UpstreamFailure::Unreachable.disposition(),
        Disposition::Release
    );
    assert_eq!(
        res.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
    assert_eq!(v["status"], 502);
    assert_eq!(v["type"], "https://idem.dev/problems/upstream-unreachable");
}

#[test]
fn too_large_answer_is_502_and_recorded() {
    let res = upstream(UpstreamFailure::AnswerTooLarge);
    assert_eq!(res.status(), 502);
    assert_eq!(
        UpstreamFailure::AnswerTooLarge.disposition(),
        Disposition::Record
    );
}

#[test]
fn unknown_outcomes_are_504_and_keep_the_record() {
    for e in [UpstreamFailure::Timeout, UpstreamFailure::ConnectionLost] {
        let res = upstream(e);
        assert_eq!(res.status(), 504);
        assert_eq!(e.disposition(), Disposition::KeepInProgress);
    }
}

#[test]
fn a_forward_error_is_found_as_it_is_or_boxed() {
    let e = ForwardError::Upstream(UpstreamFailure::Timeout);
    assert_eq!(forward_error(&e), Some(&e));
    let boxed: BoxError = Box::new(e.clone());
    assert_eq!(forward_error(&boxed), Some(&e));
    let other: BoxError = "no".into();
    assert_eq!(forward_error(&other), None);
}
