//! Stage 5 of a keyed request (SPEC S5, S6): the recorded answer replayed, rendered
//! again from its reference, or the problem a reservation that did not acquire the key
//! answers.

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use idem_core::{Reservation, Store, StoreError, StoredResponse};

use crate::IdempotencyBody;
use crate::bounds::Inner;
use crate::config::{Config, References};
use crate::handled::Handled;
use crate::hints::hint;
use crate::keyed::Keyed;
use crate::observer::{Observer, Outcome};
use crate::operation_state::OperationState;
use crate::problem::{Problem, ProblemKind};
use crate::profile::Dialect;
use crate::publish::Replayed;

/// The header that marks a replayed answer, unless the profile or a setting names
/// another ([`IdempotencyLayer::replay_header`](crate::IdempotencyLayer::replay_header)).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The detail of the 422 `key-reused`.
const KEY_REUSED_DETAIL: &str = "this key was already used for a request with a \
     different method, path, query string or body; use a new key for a new operation";

/// The answer to a reservation that did not acquire the key: stage 5's replay, or a
/// problem (a gRPC error to a gRPC call, SPEC S18). With `hints` (the route's retry
/// hints), a replayed 5xx says a retry is useless, and a 409 in progress and a 503 for
/// the store say it is worth it. `reused` is the state of the record a key reused with
/// another payload holds, where it was read (else it is unknown).
pub(crate) fn refuse<B>(
    observer: &dyn Observer,
    reserved: idem_core::Result<Reservation>,
    dialect: Dialect,
    hints: bool,
    reused: Option<OperationState>,
) -> Response<IdempotencyBody<B>> {
    let (outcome, mut response) = answer(reserved, dialect, reused);
    observer.outcome(outcome);
    Handled::mark(&mut response, outcome);
    if hints {
        let status = response.status();
        let replayed = response.extensions().get::<Replayed>().is_some();
        if replayed && status.is_server_error() {
            hint(&mut response, false);
        } else if !replayed
            && matches!(
                response.extensions().get::<ProblemKind>(),
                Some(ProblemKind::RequestInProgress | ProblemKind::StoreUnavailable)
            )
        {
            hint(&mut response, true);
        }
    }
    response
}

/// The answer to `reserved`, and what it is.
fn answer<B>(
    reserved: idem_core::Result<Reservation>,
    dialect: Dialect,
    reused: Option<OperationState>,
) -> (Outcome, Response<IdempotencyBody<B>>) {
    let (outcome, problem) = match reserved {
        Err(StoreError::Sealed(why)) => {
            // Logged with the scope's digest where the store wrapper found it.
            tracing::error!(error = %why, "a recorded answer cannot be opened; answering 500 without calling the handler");
            (
                Outcome::ReplayUnavailable,
                Problem::unopenable(
                    "this key's request was executed, and its recorded answer cannot be opened \
                     (sealed with a key this gateway lacks, or changed in the store); it is \
                     not executed again: ask the operator, and never retry with a new key",
                ),
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "idempotency store failed; answering 503 without calling the handler");
            (
                Outcome::StoreUnavailable,
                Problem::new(
                    ProblemKind::StoreUnavailable,
                    "the idempotency store cannot be reached, so the request was not executed; retry with the same key",
                ),
            )
        }
        Ok(Reservation::Replay(stored)) => {
            let trailers = trailers(&stored);
            let response =
                replay(stored).map(|body| IdempotencyBody::buffered_with_trailers(body, trailers));
            return (Outcome::Replayed, response);
        }
        Ok(Reservation::InProgress { retry_after }) => (
            Outcome::Conflict,
            Problem::new(
                ProblemKind::RequestInProgress,
                "a request with this key is still being processed; retry after the indicated time",
            )
            .retry_after(retry_after),
        ),
        Ok(Reservation::Mismatch) => (
            Outcome::Mismatch,
            // The fingerprint is one digest over all four (SPEC S4), so which of them
            // differed cannot be told; each is named, the query string too, since a
            // changed query is as much another request as a changed body.
            match reused {
                Some(state) => {
                    Problem::new(ProblemKind::KeyReused, KEY_REUSED_DETAIL).in_state(state)
                }
                None => Problem::new(ProblemKind::KeyReused, KEY_REUSED_DETAIL),
            },
        ),
        Ok(Reservation::Gone {
            completed_at,
            status,
        }) => (Outcome::Expired, Problem::key_expired(completed_at, status)),
        Ok(Reservation::Acquired(_)) => unreachable!("an acquired key is executed, not refused"),
    };
    (
        outcome,
        problem.answer(dialect).map(IdempotencyBody::buffered),
    )
}

impl<St: Store> Keyed<St> {
    /// The answer for a client whose attempt was taken over before it could record its own
    /// (its completion fenced, SPEC S7): the key's answer is the other attempt's, so this
    /// client gets what a retry would, the recorded answer replayed, or 409 while the other
    /// attempt still runs, never an answer the key's record contradicts. `None` (the
    /// attempt's own answer is passed on) when the record cannot be read, or its answer is
    /// a reference to render.
    pub(crate) async fn superseded<B>(
        &self,
        scope: &idem_core::Scope,
    ) -> Option<Response<IdempotencyBody<B>>> {
        let record = match self.store().get(scope).await {
            Ok(record) => record?,
            Err(e) => {
                tracing::warn!(error = %e, "reading the record that took this attempt over failed");
                return None;
            }
        };
        let reservation = match record.state {
            // Judged as of its creation: it was taken over moments ago, so it is live, and
            // its age must not make it look expired to a clock that is not the store's.
            idem_core::RecordState::Completed { .. } => {
                let (fingerprint, created_at) = (record.fingerprint, record.created_at);
                Reservation::from_existing(record, &fingerprint, created_at)?
            }
            idem_core::RecordState::InProgress { .. } => Reservation::InProgress {
                retry_after: std::time::Duration::from_secs(1),
            },
            idem_core::RecordState::Tombstone { .. } => return None,
        };
        if matches!(&reservation, Reservation::Replay(stored) if stored.reference().is_some()) {
            return None;
        }
        let (dialect, hints) = (self.dialect(), self.answers.retry_hints);
        let mut response = refuse(self.observer(), Ok(reservation), dialect, hints, None);
        Handled::scoped(&mut response, scope);
        Some(response)
    }

    /// Stage 5 for an answer recorded as a [`ResourceReference`](crate::ResourceReference):
    /// rendered again (see [`render`]) where this layer renders references, else a 503
    /// `replay-unavailable` in the request's dialect.
    pub(crate) async fn rendered<S: Inner<ReqBody, ResBody>, ReqBody, ResBody>(
        &self,
        inner: S,
        parts: Parts,
        stored: StoredResponse,
    ) -> Response<IdempotencyBody<ResBody>> {
        let (config, observer, dialect) = (self.config(), self.observer(), self.dialect());
        if !config.references.honoured() {
            // Recorded where references are rendered (another instance, or this one before
            // a change of settings): an empty body would be a lie.
            observer.outcome(Outcome::ReplayUnavailable);
            let reference = stored.reference().unwrap_or_default();
            let why = "this layer does not render references";
            let mut response = replay_unavailable(reference, why, dialect);
            Handled::mark(&mut response, Outcome::ReplayUnavailable);
            return response;
        }
        let mut response = render(inner, parts, stored, config, dialect).await;
        let outcome = if response.status().is_success() {
            OperationState::Completed.mark(response.headers_mut());
            Outcome::Replayed
        } else {
            Outcome::ReplayUnavailable
        };
        observer.outcome(outcome);
        Handled::mark(&mut response, outcome);
        response
    }
}

/// The trailers recorded with an answer (a gRPC call's status), to send as trailers
/// again; `None` when there are none.
fn trailers(stored: &StoredResponse) -> Option<HeaderMap> {
    let mut trailers = HeaderMap::new();
    for (name, value) in stored.trailers() {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value.clone()),
        ) {
            (Ok(name), Ok(value)) => {
                trailers.append(name, value);
            }
            _ => {
                tracing::warn!(trailer = %name, "skipping a stored trailer that is not valid HTTP")
            }
        }
    }
    (!trailers.is_empty()).then_some(trailers)
}

/// Stage 5: the recorded answer, marked as a replay (the marker's header is put on
/// under its name once the answer leaves the request's steps, see [`Published`]).
///
/// [`Published`]: crate::publish::Published
fn replay(stored: StoredResponse) -> Response<Bytes> {
    let mut response = Response::new(stored.body.clone());
    *response.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in stored.http_headers() {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value.clone()),
        ) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => tracing::warn!(header = %name, "skipping a stored header that is not valid HTTP"),
        }
    }
    OperationState::Completed.mark(headers);
    response.extensions_mut().insert(Replayed);
    response
}

/// The 503 for an answer recorded as `reference` that cannot be rendered now, and why,
/// in `dialect`.
fn replay_unavailable<B>(
    reference: &str,
    why: &str,
    dialect: Dialect,
) -> Response<IdempotencyBody<B>> {
    tracing::warn!(reference, "{why}");
    Problem::new(
        ProblemKind::ReplayUnavailable,
        format!(
            "this key's request was executed, and its answer is recorded as {reference}, \
             which could not be rendered now ({why}); retry with the same key, never a new one"
        ),
    )
    .answer(dialect)
    .map(IdempotencyBody::buffered)
}

/// The headers that describe a representation, taken from a rendered answer rather
/// than from the recorded one.
const REPRESENTATION_HEADERS: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::ETAG,
    header::LAST_MODIFIED,
];

/// Stage 5 for an answer recorded as a [`ResourceReference`]: the layer's `renderer`,
/// or else the wrapped service, is asked for `GET <reference>` with the retry's headers,
/// and a 2xx answer is replayed under the recorded status and headers; anything else is
/// a 503 `replay-unavailable` in `dialect`.
async fn render<S: Inner<ReqBody, ResBody>, ReqBody, ResBody>(
    mut inner: S,
    parts: Parts,
    stored: StoredResponse,
    config: &Config,
    dialect: Dialect,
) -> Response<IdempotencyBody<ResBody>> {
    let reference = stored.reference().unwrap_or_default().to_owned();
    let unavailable = |why: String| replay_unavailable(&reference, &why, dialect);
    let mut uri = http::Uri::builder();
    if let (Some(scheme), Some(authority)) = (parts.uri.scheme(), parts.uri.authority()) {
        uri = uri.scheme(scheme.clone()).authority(authority.clone());
    }
    let uri = match uri.path_and_query(reference.as_str()).build() {
        Ok(uri) => uri,
        Err(e) => return unavailable(format!("not a path: {e}")),
    };
    let mut headers = parts.headers;
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::TRANSFER_ENCODING,
        header::EXPECT,
    ] {
        headers.remove(name);
    }
    headers.remove(&config.header_name);
    let mut get = Request::new(());
    *get.method_mut() = Method::GET;
    *get.uri_mut() = uri;
    *get.version_mut() = parts.version;
    *get.headers_mut() = headers;
    *get.extensions_mut() = parts.extensions;
    let rendered = match &config.references {
        References::With(render) => render(get)
            .await
            .map(|rendered| rendered.map(IdempotencyBody::buffered)),
        References::ThroughService | References::Ignored => inner
            .call(get.map(|()| IdempotencyBody::buffered(Bytes::new())))
            .await
            .map(|rendered| rendered.map(IdempotencyBody::stream))
            .map_err(Into::into),
    };
    let rendered = match rendered {
        Ok(rendered) => rendered,
        // A proxy that could not forward the `GET`: its upstream failed, as said.
        Err(e) => match crate::forward::forward_error(&e) {
            Some(failed) => {
                if let Some(failure) = failed.upstream_failure() {
                    config.observer.upstream_failed(failure);
                }
                return unavailable(format!("GET answered {}", failed.problem().status()));
            }
            None => return unavailable(format!("rendering failed: {e}")),
        },
    };
    if !rendered.status().is_success() {
        return unavailable(format!("GET answered {}", rendered.status()));
    }
    let (head, body) = rendered.into_parts();
    let mut response = replay(stored).map(|_| body);
    let headers = response.headers_mut();
    for name in REPRESENTATION_HEADERS {
        headers.remove(&name);
        for value in head.headers.get_all(&name) {
            headers.append(name.clone(), value.clone());
        }
    }
    if let Ok(location) = HeaderValue::from_str(&reference) {
        headers.insert(header::CONTENT_LOCATION, location);
    }
    response
}
