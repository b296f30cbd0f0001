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
//! `admin-token-required` (401, with `WWW-Authenticate: Bearer`), `admin-route-closed`
//! and `admin-cross-site` (403), `no-record` and `no-admin-route` (404),
//! `admin-method-not-allowed` (405) and `store-unavailable` (503, `/readyz` included).
//!
//! Who may call what ([`AdminAccess`], put in force again by every reload):
//!
//! - With `--admin-token` (or `--admin-token-file`), every route but the two probes
//!   needs `Authorization: Bearer TOKEN` (the scheme in any case, RFC 9110 §11.1), the
//!   token compared in constant time.
//! - Without one, the routes that change records or the configuration, or show records
//!   (every tenant's, recorded answers included) — all of `/keys` and `/reload` — are
//!   refused with 403 `admin-route-closed`, unless the operator says `--admin-open`;
//!   `/metrics` is served.
//! - Whatever the token, a request a browser marks as sent from another site
//!   (`Sec-Fetch-Site` other than `same-origin` or `none`, or an `Origin` that is not
//!   the listener's own) is refused with 403 `admin-cross-site` on every route but the
//!   probes: a page the operator's browser opens cannot reach the listener on loopback
//!   behind their back.
//!
//! A bare `--admin PORT` binds to 127.0.0.1.
//!
//! It is served like the proxy ([`crate::listener`]): at most
//! [`ADMIN_MAX_CONNECTIONS`](crate::listener::ADMIN_MAX_CONNECTIONS) connections open,
//! and the client timeout for each request's head, so idle admin connections can neither
//! pile up nor take the proxy's file descriptors.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
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
    /// Who may call what: swapped by a reload.
    pub(crate) access: Arc<ArcSwap<AdminAccess>>,
    /// What `POST /reload` reloads and `/readyz` reports the generation of; `None`
    /// serves no `/reload`.
    pub(crate) reloader: Option<Arc<dyn Reload>>,
}

/// Who may call the admin routes: the bearer token, if one is required, and whether
/// the routes that show or change records are open without one.
#[derive(Clone, Default)]
pub(crate) struct AdminAccess {
    /// The bearer token every route but the probes requires, if any.
    pub(crate) token: Option<Arc<str>>,
    /// `--admin-open`: without a token, `/keys` and `/reload` are served to anyone.
    pub(crate) open: bool,
}

impl AdminAccess {
    /// The access a configuration gives.
    pub(crate) fn of(config: &crate::config::GatewayConfig) -> AdminAccess {
        AdminAccess {
            token: config.admin_token.as_deref().map(Arc::from),
            open: config.admin_open,
        }
    }

    /// In a form that can be swapped by a reload.
    pub(crate) fn shared(self) -> Arc<ArcSwap<AdminAccess>> {
        Arc::new(ArcSwap::from_pointee(self))
    }
}

impl std::fmt::Debug for AdminAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminAccess")
            .field("token", &self.token.as_ref().map(|_| "set"))
            .field("open", &self.open)
            .finish()
    }
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
    let records = Router::new()
        .route("/keys", get(get_keys).delete(delete_key))
        .route("/keys/purge-expired", post(purge))
        .route("/reload", post(reload))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_open));
    let protected = Router::new()
        .route("/metrics", get(metrics))
        .merge(records)
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .route_layer(middleware::from_fn(same_origin));
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

/// Refuses a request a browser sent from another site: `Sec-Fetch-Site` other than
/// `same-origin` or `none` (the user's own navigation), or an `Origin` whose host and
/// port are not the `Host` the request was sent to. Clients other than browsers send
/// neither, and pass.
async fn same_origin(req: Request, next: Next) -> Response {
    match cross_site(&req) {
        None => next.run(req).await,
        Some(why) => problem(
            StatusCode::FORBIDDEN,
            "https://idem.dev/problems/admin-cross-site",
            "A browser sent this admin request from another site",
            format!(
                "{why}: the admin listener serves no page of another origin; call it from \
                 the command line or a tool that is not a browser"
            ),
        ),
    }
}

/// Why `req` looks sent by a browser from another site, if it does.
fn cross_site(req: &Request) -> Option<String> {
    let headers = req.headers();
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("");
        if !(site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none")) {
            return Some(format!("Sec-Fetch-Site is {site:?}"));
        }
    }
    let origin = headers.get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("");
    // The authority the request was sent to: HTTP/1.1's Host, HTTP/2's :authority.
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    let origin_host = origin
        .split_once("://")
        .map(|(_, authority)| authority.trim_end_matches('/'));
    match (origin_host, host) {
        (Some(o), Some(h)) if o.eq_ignore_ascii_case(h) => None,
        _ => Some(format!("Origin is {origin:?}, not this listener")),
    }
}

/// Refuses the routes that show or change records and the configuration when no token
/// is required, unless the operator opened them (`--admin-open`).
async fn require_open(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let access = state.access.load();
    if access.token.is_some() || access.open {
        return next.run(req).await;
    }
    problem(
        StatusCode::FORBIDDEN,
        "https://idem.dev/problems/admin-route-closed",
        "This admin route needs an admin token",
        "the gateway has no --admin-token, and this route shows or changes records or the \
         configuration: set --admin-token-file (or --admin-token) and send Authorization: \
         Bearer TOKEN, or serve it to anyone who can reach the listener with --admin-open"
            .into(),
    )
}

async fn require_token(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let access = state.access.load();
    let Some(token) = &access.token else {
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
mod tests;
