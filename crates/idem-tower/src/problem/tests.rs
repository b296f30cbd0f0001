use super::*;

#[test]
fn problem_body_has_rfc9457_members() {
    let p = Problem::new(ProblemKind::KeyReused, "the key was used for another body");
    let r = p.to_response();
    assert_eq!(r.status(), 422);
    assert_eq!(
        r.extensions().get::<ProblemKind>(),
        Some(&ProblemKind::KeyReused)
    );
    assert_eq!(r.headers()[header::CONTENT_TYPE], PROBLEM_CONTENT_TYPE);
    assert!(r.headers().get(header::RETRY_AFTER).is_none());
    let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
    assert_eq!(v["type"], "https://idem.dev/problems/key-reused");
    assert_eq!(v["title"], ProblemKind::KeyReused.title());
    assert_eq!(v["status"], 422);
    assert_eq!(v["detail"], "the key was used for another body");
    assert_eq!(v["operation_state"], "unknown");
    assert_eq!(r.headers()["idempotency-operation-state"], "unknown");
    let held = p.in_state(OperationState::Completed).to_response();
    assert_eq!(held.headers()["idempotency-operation-state"], "completed");
    let v: serde_json::Value = serde_json::from_slice(held.body()).unwrap();
    assert_eq!(v["operation_state"], "completed");
}

#[test]
fn key_expired_is_410_and_says_when_and_how_it_completed() {
    // 2026-12-01T09:30:00.125Z
    let at = idem_core::Timestamp::from_millis(1_796_117_400_125);
    let r = Problem::key_expired(at, 201).to_response();
    assert_eq!(r.status(), 410);
    assert!(r.headers().get(header::RETRY_AFTER).is_none());
    let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
    assert_eq!(v["type"], "https://idem.dev/problems/key-expired");
    assert_eq!(v["status"], 410);
    assert_eq!(v["completed_at"], "2026-12-01T09:30:00.125Z");
    assert_eq!(v["completed_status"], 201);
    assert_eq!(v["operation_state"], "completed");
    let detail = v["detail"].as_str().unwrap();
    assert!(detail.contains("2026-12-01T09:30:00.125Z") && detail.contains("201"));
    assert!(detail.contains("not executed again"), "{detail}");
}

#[test]
fn conflict_and_unavailable_carry_retry_after() {
    let r = Problem::new(ProblemKind::RequestInProgress, "busy")
        .retry_after(Duration::from_millis(2_001))
        .to_response();
    assert_eq!(r.status(), 409);
    assert_eq!(r.headers()[header::RETRY_AFTER], "3");
    let r = Problem::new(ProblemKind::StoreUnavailable, "down").to_response();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()[header::RETRY_AFTER], "1");
}

#[test]
fn missing_tenant_is_401_with_a_challenge() {
    let r = Problem::new(ProblemKind::MissingTenant, "send Authorization").to_response();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
    assert!(r.headers().get(header::RETRY_AFTER).is_none());
    let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
    assert_eq!(v["type"], "https://idem.dev/problems/missing-tenant");
    assert_eq!(v["status"], 401);
}

#[test]
fn type_uris_are_distinct_and_stable() {
    let uris: std::collections::HashSet<_> =
        ProblemKind::ALL.iter().map(|k| k.type_uri()).collect();
    assert_eq!(uris.len(), ProblemKind::ALL.len());
    for uri in uris {
        assert!(uri.starts_with("https://idem.dev/problems/"), "{uri}");
    }
}

#[test]
fn problems_say_where_the_operation_stands() {
    use OperationState::*;
    let cases = [
        (ProblemKind::InvalidKey, NotStarted),
        (ProblemKind::MissingKey, NotStarted),
        (ProblemKind::KeyRateExceeded, NotStarted),
        (ProblemKind::UpstreamUnreachable, NotStarted),
        (ProblemKind::RequestInProgress, InProgress),
        (ProblemKind::KeyExpired, Completed),
        (ProblemKind::HandlerFailed, Completed),
        (ProblemKind::UpstreamAnswerTooLarge, Completed),
        (ProblemKind::UpstreamTimeout, Unknown),
        (ProblemKind::UpstreamConnectionLost, Unknown),
        (ProblemKind::StoreUnavailable, Unknown),
    ];
    for (kind, state) in cases {
        assert_eq!(OperationState::of_problem(kind), state, "{kind:?}");
    }
}
