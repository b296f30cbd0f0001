//! The admin listener (`--admin ADDR`): probes, metrics and key inspection.
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200 when the store answers a ping, else 503; names the configuration generation in force |
//! | `GET /metrics` | Prometheus text |
//! | `GET /keys?key=K[&tenant=T][&endpoint=E]` | the record as JSON, or 404 |
//! | `GET /keys[?state=S][&older_than=D][&ambiguous=true][&limit=N][&after=C]` | records as JSON lines; `Idem-Next-Cursor` names the next page |
//! | `DELETE /keys?key=K[&tenant=T][&endpoint=E]` | deletes the record, or 404 |
//! | `POST /keys/purge-expired` | deletes expired records, `{"purged": n}` |
//! | `POST /reload` | reads the configuration again: `{"generation": n, "applied": [...], "restart_required": [...]}`, or 422 `reload-refused` |
//!
//! Every error is an RFC 9457 `application/problem+json` body whose `type` is under
//! `https://idem.dev/problems/`: `bad-key-query` and `bad-listing` (400),
//! `admin-token-required` (401, with `WWW-Authenticate: Bearer`), `no-record` and
//! `no-admin-route` (404), `admin-method-not-allowed` (405) and `store-unavailable`
//! (503, `/readyz` included).
//!
//! With `--admin-token` (or `--admin-token-file`), every route but the two probes needs
//! `Authorization: Bearer TOKEN` (the scheme in any case, RFC 9110 §11.1), the token
//! compared in constant time. A bare `--admin PORT`
//! binds to 127.0.0.1.
//!
//! It is served like the proxy ([`crate::listener`]): at most
//! [`ADMIN_MAX_CONNECTIONS`](crate::listener::ADMIN_MAX_CONNECTIONS) connections open,
//! and the client timeout for each request's head, so idle admin connections can neither
//! pile up nor take the proxy's file descriptors.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem_core::{Clock, Store, SystemClock};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::inspect::{line_json, purge_expired, query_from_params, record_json, scope_for};
use crate::listener::{ConnectionSlot, Listener};
use crate::metrics::Metrics;

/// How long the admin listener's connections are given to finish at shutdown.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// What the admin routes share.
#[derive(Clone)]
pub(crate) struct AdminState {
    /// The record store.
    pub(crate) store: Arc<dyn Store>,
    /// The gateway's metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// The bearer token, if one is required.
    pub(crate) token: Option<Arc<str>>,
    /// What `POST /reload` reloads and `/readyz` reports the generation of; `None`
    /// serves no `/reload`.
    pub(crate) reloader: Option<Arc<dyn Reload>>,
}

/// What `POST /reload` and `/readyz` ask of the gateway's configuration (the gateway's
/// is [`Reloader`](crate::serve::Reloader)).
#[async_trait::async_trait]
pub(crate) trait Reload: Send + Sync {
    /// The configuration generation in force.
    fn generation(&self) -> u64;
    /// Why the last reload was refused, if the last one was.
    fn last_error(&self) -> Option<String>;
    /// Reads the configuration again and puts it in force: what changed, as the JSON
    /// `POST /reload` answers, or why the configuration in force stays.
    async fn reload(&self) -> Result<serde_json::Value, String>;
}

/// The admin listener, serving in a task of its own until stopped.
pub(crate) struct AdminTask {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// Serves the admin router on `listener` until the task is stopped.
pub(crate) fn spawn(listener: Listener, state: AdminState) -> AdminTask {
    let (stop, stopped) = oneshot::channel::<()>();
    let router = router(state);
    let task = tokio::spawn(async move {
        let serve = |_, _: &ConnectionSlot| {
            let router = router.clone();
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                router.clone().oneshot(req)
            })
        };
        let stopped = async {
            let _ = stopped.await;
        };
        let connections = listener.run(serve, stopped).await;
        connections.finish(Instant::now() + SHUTDOWN_WAIT).await;
    });
    AdminTask { stop, task }
}

impl AdminTask {
    /// Stops accepting, and gives the open connections a moment to finish.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(SHUTDOWN_WAIT + Duration::from_secs(1), self.task).await;
    }
}

/// The admin router.
pub(crate) fn router(state: AdminState) -> Router {
    let protected = Router::new()
        .route("/metrics", get(metrics))
        .route("/keys", get(get_keys).delete(delete_key))
        .route("/keys/purge-expired", post(purge))
        .route("/reload", post(reload))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .merge(protected)
        .fallback(|| async {
            problem(
                StatusCode::NOT_FOUND,
                "https://idem.dev/problems/no-admin-route",
                "No such admin route",
                "the admin listener serves /healthz, /readyz, /metrics, /keys, \
                 /keys/purge-expired and /reload"
                    .into(),
            )
        })
        .method_not_allowed_fallback(|| async {
            problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "https://idem.dev/problems/admin-method-not-allowed",
                "Method not allowed on this admin route",
                "see the Allow header for the methods this route takes".into(),
            )
        })
        .with_state(state)
}

/// An admin error: an RFC 9457 problem of type `type_uri`.
fn problem(status: StatusCode, type_uri: &str, title: &str, detail: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        json!({
            "type": type_uri,
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
        })
        .to_string(),
    )
        .into_response()
}

async fn require_token(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return next.run(req).await;
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    match presented {
        Some(p) if token_matches(p.as_bytes(), token.as_bytes()) => next.run(req).await,
        _ => {
            let mut answer = problem(
                StatusCode::UNAUTHORIZED,
                "https://idem.dev/problems/admin-token-required",
                "An admin bearer token is required",
                "send Authorization: Bearer with the gateway's --admin-token".into(),
            );
            answer.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            answer
        }
    }
}

async fn ready(State(state): State<AdminState>) -> Response {
    match state.store.ping().await {
        Ok(()) => match &state.reloader {
            Some(reloader) => {
                let generation = reloader.generation();
                let mut body = format!("ready\nconfiguration generation {generation}\n");
                if let Some(refused) = reloader.last_error() {
                    body.push_str(&format!("last reload refused: {refused}\n"));
                }
                (
                    StatusCode::OK,
                    [("idem-config-generation", generation.to_string())],
                    body,
                )
                    .into_response()
            }
            None => (StatusCode::OK, "ready\n").into_response(),
        },
        Err(e) => {
            tracing::warn!(error = %e, "readiness: store unreachable");
            store_error(e)
        }
    }
}

/// `POST /reload`: the configuration read again and put in force (see [`Reload`]);
/// the generation and what changed, or a 422 `reload-refused` saying why the
/// configuration in force stays.
async fn reload(State(state): State<AdminState>) -> Response {
    let Some(reloader) = &state.reloader else {
        return problem(
            StatusCode::NOT_FOUND,
            "https://idem.dev/problems/no-admin-route",
            "No such admin route",
            "this gateway has no configuration to reload".into(),
        );
    };
    match reloader.reload().await {
        Ok(done) => Json(done).into_response(),
        Err(e) => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "https://idem.dev/problems/reload-refused",
            "Reload refused; the configuration in force stays",
            format!(
                "{e}; configuration generation {} stays in force",
                reloader.generation()
            ),
        ),
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

#[derive(Deserialize)]
struct KeyQuery {
    key: String,
    tenant: Option<String>,
    endpoint: Option<String>,
}

fn bad_request(detail: String) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "https://idem.dev/problems/bad-key-query",
        "The key's query is not valid",
        detail,
    )
}

fn store_error(e: idem_core::StoreError) -> Response {
    // The proxy's problem of the same name, told apart by its detail.
    let kind = idem_tower::ProblemKind::StoreUnavailable;
    let mut answer = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "https://idem.dev/problems/store-unavailable",
        kind.title(),
        format!("the store could not be reached: {e}"),
    );
    answer
        .headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    answer
}

fn no_record() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "https://idem.dev/problems/no-record",
        "No record for that key in that scope",
        "no record for that key in that scope: check tenant and endpoint (see GET /keys)".into(),
    )
}

/// The response header naming where the next page of a listing starts; absent on the
/// last page.
pub(crate) const NEXT_CURSOR_HEADER: &str = "idem-next-cursor";

/// `GET /keys`: one key's record when the query names a key, else a listing.
async fn get_keys(
    State(state): State<AdminState>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let names_a_key = params
        .iter()
        .any(|(name, _)| matches!(name.as_str(), "key" | "tenant" | "endpoint"));
    if !names_a_key {
        return list_keys(state, &params).await;
    }
    match key_query(params) {
        Ok(q) => show_key(state, q).await,
        Err(detail) => bad_request(detail),
    }
}

/// The query of `GET` and `DELETE /keys?key=K[&tenant=T][&endpoint=E]`, or what is
/// wrong with it (for the 400 `bad-key-query` problem).
fn key_query(params: Vec<(String, String)>) -> Result<KeyQuery, String> {
    let mut q = KeyQuery {
        key: String::new(),
        tenant: None,
        endpoint: None,
    };
    let mut key = None;
    for (name, value) in params {
        match name.as_str() {
            "key" => key = Some(value),
            "tenant" => q.tenant = Some(value),
            "endpoint" => q.endpoint = Some(value),
            other => {
                return Err(format!(
                    "{other:?} does not go with key: show or delete one key's record with \
                     key, tenant and endpoint, or list records without them"
                ));
            }
        }
    }
    match key {
        Some(key) => q.key = key,
        None => {
            return Err("give the key whose record to show or delete".into());
        }
    }
    Ok(q)
}

/// A listing, one JSON line per record (see [`line_json`]).
async fn list_keys(state: AdminState, params: &[(String, String)]) -> Response {
    let query = match query_from_params(params.iter().map(|(n, v)| (n.as_str(), v.as_str()))) {
        Ok(query) => query,
        Err(detail) => return bad_listing(detail),
    };
    let page = match state.store.list(&query).await {
        Ok(page) => page,
        Err(idem_core::StoreError::InvalidCursor(_)) => {
            return bad_listing(
                "after names no page of this store: pass the Idem-Next-Cursor of a page".into(),
            );
        }
        Err(e) => return store_error(e),
    };
    let now = SystemClock.now();
    let mut body = String::new();
    for record in &page.records {
        body.push_str(&line_json(record, now).to_string());
        body.push('\n');
    }
    let mut response = ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    if let Some(next) = page.next
        && let Ok(value) = header::HeaderValue::from_str(next.as_str())
    {
        response.headers_mut().insert(NEXT_CURSOR_HEADER, value);
    }
    response
}

/// A 400 problem for a listing's parameters.
fn bad_listing(detail: String) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "https://idem.dev/problems/bad-listing",
        "The listing's parameters are not valid",
        detail,
    )
}

async fn show_key(state: AdminState, q: KeyQuery) -> Response {
    let scope = match scope_for(&q.key, q.tenant.as_deref(), q.endpoint.as_deref()) {
        Ok(s) => s,
        Err(e) => return bad_request(e),
    };
    match state.store.get(&scope).await {
        Ok(Some(record)) => Json(record_json(&record, SystemClock.now())).into_response(),
        Ok(None) => no_record(),
        Err(e) => store_error(e),
    }
}

async fn delete_key(
    State(state): State<AdminState>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let q = match key_query(params) {
        Ok(q) => q,
        Err(detail) => return bad_request(detail),
    };
    let scope = match scope_for(&q.key, q.tenant.as_deref(), q.endpoint.as_deref()) {
        Ok(s) => s,
        Err(e) => return bad_request(e),
    };
    match state.store.remove(&scope).await {
        Ok(true) => Json(json!({ "removed": 1 })).into_response(),
        Ok(false) => no_record(),
        Err(e) => store_error(e),
    }
}

async fn purge(State(state): State<AdminState>) -> Response {
    let n = purge_expired(&*state.store).await;
    Json(json!({ "purged": n })).into_response()
}

/// The token of an `Authorization: Bearer TOKEN` value: the scheme is matched ignoring
/// case and may be followed by several spaces (RFC 9110 §11.1, §11.4).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether `presented` is the token, in a time that depends on neither where the two
/// first differ nor how long the expected token is, so it cannot be guessed byte by
/// byte (or its length learnt) from response times: both are hashed to 32 bytes, and
/// the digests compared in constant time.
fn token_matches(presented: &[u8], token: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(presented), Sha256::digest(token));
    bool::from(a.as_slice().ct_eq(b.as_slice()))
}

#[cfg(test)]
mod tests {
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
        let state = AdminState {
            store: store.clone(),
            metrics: Arc::new(Metrics::new()),
            token: token.map(Arc::from),
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
}
