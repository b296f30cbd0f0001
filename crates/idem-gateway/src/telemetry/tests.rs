use super::*;

#[test]
fn the_gateways_setting_wins_over_the_standard_variable() {
    assert_eq!(
        traces_url(Some("http://a:4318"), Some("http://b:4318")).unwrap(),
        Some("http://a:4318/v1/traces".to_owned())
    );
    assert_eq!(
        traces_url(None, Some("http://b:4318/")).unwrap(),
        Some("http://b:4318/v1/traces".to_owned())
    );
    assert_eq!(
        traces_url(Some(""), Some("http://b:4318/otel")).unwrap(),
        Some("http://b:4318/otel/v1/traces".to_owned())
    );
    assert_eq!(traces_url(None, None).unwrap(), None);
    assert_eq!(traces_url(Some(""), Some("")).unwrap(), None);
}

#[test]
fn only_a_plain_http_base_url_is_an_endpoint() {
    for bad in [
        "https://collector:4318",
        "collector:4318",
        "http://collector:4318/?x=1",
        "not a url",
    ] {
        assert!(traces_url(Some(bad), None).is_err(), "{bad}");
        // The standard variable, set for every process, never stops the start.
        assert_eq!(traces_url(None, Some(bad)), Ok(None), "{bad}");
    }
}

#[test]
fn traceparent_round_trips() {
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let sc = parse_traceparent(tp).expect("valid");
    assert_eq!(
        sc.trace_id().to_string(),
        "0af7651916cd43dd8448eb211c80319c"
    );
    assert!(sc.is_sampled() && sc.is_remote());
    assert_eq!(format_traceparent(&sc), tp);
    for bad in [
        "",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-00",
        "00-0af7651916cd43dd8448eb211c80319cxx-b7ad6b71692033-01",
    ] {
        assert!(parse_traceparent(bad).is_none(), "{bad}");
    }
}

#[test]
fn store_spans_name_the_backend() {
    assert_eq!(store_system("sqlite://idem.db"), Some("sqlite"));
    assert_eq!(store_system("postgres://u@h/db"), Some("postgresql"));
    assert_eq!(store_system("redis://h:6379"), Some("redis"));
    assert_eq!(store_system("memory://"), None);
}

/// Outside a traced request the upstream gets the client's trace headers as sent,
/// and no span is made.
#[test]
fn an_untraced_request_keeps_its_trace_headers() {
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut up = Request::builder()
        .header("traceparent", tp)
        .header("tracestate", "vendor=1")
        .body(())
        .unwrap();
    let call = UpstreamCall::start(&mut up);
    assert!(call.0.is_none());
    assert_eq!(up.headers()["traceparent"], tp);
    assert_eq!(up.headers()["tracestate"], "vendor=1");
}
