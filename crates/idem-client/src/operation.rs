//! One business operation and its retry loop (SPEC S11).
//!
//! The key is chosen when the operation is made, outside any loop, and the operation
//! owns it: [`Operation::send`] takes `&self`, so sending it again (after an
//! [`Error::Exhausted`], or from a retry loop of the caller's own) sends the same key.
//! Getting a new key takes a new operation or an explicit
//! [`with_key`](Operation::with_key).

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};
use idem_core::Key;
use reqwest::Url;

use crate::{Client, Error, Failure, GiveUp, Outcome, Result, Retryable, random_key, retry_after};

/// The least wait after a 409 that does not count against the maximum attempts, should
/// a server ask for less (`Retry-After: 0`).
const MIN_CONFLICT_WAIT: Duration = Duration::from_secs(1);

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A request with its key, ready to be sent (and sent again) with retries.
///
/// Cloning an operation keeps its key: a clone is the same operation.
#[derive(Clone)]
pub struct Operation {
    client: Client,
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Bytes,
    key: Key,
    error: Option<String>,
}

impl fmt::Debug for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operation")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("key", &self.key)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl Operation {
    pub(crate) fn new(client: Client, method: Method, url: &str) -> Operation {
        Operation {
            client,
            method,
            url: url.to_owned(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            key: random_key(),
            error: None,
        }
    }

    /// An operation read back from a journal.
    #[cfg(feature = "journal")]
    pub(crate) fn restore(
        client: Client,
        method: Method,
        url: String,
        headers: HeaderMap,
        body: Bytes,
        key: Key,
    ) -> Operation {
        Operation {
            client,
            method,
            url,
            headers,
            body,
            key,
            error: None,
        }
    }

    /// Replaces the random key with `key`: one derived from the business operation
    /// ([`KeyDeriver`](crate::KeyDeriver)), or one stored before a restart.
    pub fn with_key(mut self, key: Key) -> Operation {
        self.key = key;
        self
    }

    /// Adds a header; `Content-Type`, which a request carries once, is replaced rather
    /// than added to. An invalid name or value, or an `Idempotency-Key` header (the
    /// operation sets that itself; use [`with_key`](Self::with_key)), makes
    /// [`send`](Self::send) fail with [`Error::Build`] before anything is sent.
    pub fn header<K, V>(mut self, name: K, value: V) -> Operation
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: fmt::Display,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: fmt::Display,
    {
        let name = match HeaderName::try_from(name) {
            Ok(n) => n,
            Err(e) => return self.fail(format!("invalid header name: {e}")),
        };
        if name == IDEMPOTENCY_KEY {
            return self.fail(
                "the operation sets Idempotency-Key itself; use with_key() to choose it".into(),
            );
        }
        match HeaderValue::try_from(value) {
            Ok(v) => {
                if name == CONTENT_TYPE {
                    self.headers.insert(name, v);
                } else {
                    self.headers.append(name, v);
                }
                self
            }
            Err(e) => self.fail(format!("invalid value for header {name}: {e}")),
        }
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Operation {
        self.body = body.into();
        self
    }

    /// Sets a JSON body, and `content-type: application/json` unless a content type was
    /// set already (`application/vnd.api+json`, say).
    pub fn json<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Operation {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.body = body.into();
                self.headers
                    .entry(CONTENT_TYPE)
                    .or_insert(HeaderValue::from_static("application/json"));
                self
            }
            Err(e) => self.fail(format!("the JSON body could not be serialised: {e}")),
        }
    }

    fn fail(mut self, error: String) -> Operation {
        self.error.get_or_insert(error);
        self
    }

    /// The key every attempt carries.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The operation's own headers (not the HTTP client's defaults, not the key).
    pub fn header_map(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body.
    pub fn body_bytes(&self) -> &Bytes {
        &self.body
    }

    /// The client the operation is sent with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Sends the operation, retrying with the same key as the client's policy, budget
    /// and classifier allow, and returns the final answer.
    ///
    /// * `Ok` — an answer that is not retried: a success, a replay of one, a 4xx other
    ///   than 400/422, a 5xx other than 502/503/504. [`Outcome::replayed`] tells whether
    ///   it came from the server's record.
    /// * [`Error::KeyReused`], [`Error::InvalidKey`], [`Error::Rejected`] — 422 and 400,
    ///   never retried; [`Error::KeyExpired`] — 410 `key-expired`, never retried.
    /// * [`Error::Exhausted`] — retries stopped without an answer; the outcome is
    ///   unknown, and calling `send` again later (same key) is how to learn it.
    pub async fn send(&self) -> Result<Outcome> {
        let url = self.checked_url()?;
        let inner = &self.client.inner;
        let policy = &inner.policy;
        let key_value = key_header_value(&self.key);
        let deadline = inner.clock.now().plus(policy.get_deadline());
        inner.budget.deposit();

        let mut attempts = 0u32;
        // Attempts that count against the maximum. A 409 after the first attempt does
        // not: another attempt holds the key, nothing ran for this one, and the wait
        // the server asks for is how a slow or crashed first attempt is outlasted
        // (idem asks again after as long as the attempt has run, up to its lease).
        // The deadline bounds those waits.
        let mut counted = 0u32;
        loop {
            attempts += 1;
            let now = inner.clock.now();
            // The wait before this attempt ended before the deadline, so some time is
            // left; the floor only guards a sleeper that overslept.
            let remaining = deadline.since(now);
            let timeout = policy
                .get_attempt_timeout()
                .min(remaining)
                .max(Duration::from_millis(1));
            let result = self.attempt(url.clone(), &key_value, timeout).await;
            let verdict = match &result {
                Ok(o) => inner.classifier.classify_status(o.status, &o.headers),
                Err(e) => inner.classifier.classify_error(e),
            };
            let failure = match (verdict, result) {
                (Retryable::Fatal, Ok(mut outcome)) => {
                    outcome.attempts = attempts;
                    return self.finish(outcome);
                }
                (Retryable::Fatal, Err(source)) => {
                    return Err(Error::Transport {
                        key: self.key.clone(),
                        attempts,
                        source,
                    });
                }
                (Retryable::Transient, Ok(mut outcome)) => {
                    outcome.attempts = attempts;
                    Failure::Answer(outcome)
                }
                (Retryable::Transient, Err(e)) => Failure::Transport(e),
            };

            let conflict =
                matches!(&failure, Failure::Answer(o) if o.status == StatusCode::CONFLICT);
            if !conflict || attempts == 1 {
                counted += 1;
            }
            if counted >= policy.get_max_attempts() {
                return Err(self.exhausted(attempts, GiveUp::MaxAttempts, failure));
            }
            let now = inner.clock.now();
            let asked = match &failure {
                Failure::Answer(o) => retry_after(&o.headers, now),
                Failure::Transport(_) => None,
            };
            let wait = match asked {
                // Uncounted waits never run hot, whatever the server says.
                Some(wait) if conflict => wait.max(MIN_CONFLICT_WAIT),
                Some(wait) => wait,
                None => inner.jitter.full(policy.backoff_ceiling(attempts)),
            };
            if now.plus(wait) >= deadline {
                return Err(self.exhausted(attempts, GiveUp::Deadline, failure));
            }
            // A 409 costs the server a lookup, paced by its own Retry-After: it does
            // not draw on the budget that keeps retries from piling on a failing server.
            if !conflict && !inner.budget.try_withdraw() {
                return Err(self.exhausted(attempts, GiveUp::Budget, failure));
            }
            tracing::debug!(
                key = %self.key,
                attempt = attempts,
                wait_ms = wait.as_millis() as u64,
                last = %failure,
                "retrying idempotent operation"
            );
            inner.sleeper.sleep(wait).await;
        }
    }

    /// The URL to send to, or why the operation cannot be sent: it was built wrong,
    /// its URL does not parse, or its scheme cannot be sent.
    pub(crate) fn checked_url(&self) -> Result<Url> {
        if let Some(e) = &self.error {
            return Err(Error::Build(e.clone()));
        }
        let url = Url::parse(&self.url)
            .map_err(|e| Error::Build(format!("invalid URL {:?}: {e}", self.url)))?;
        match url.scheme() {
            "http" => Ok(url),
            "https" if cfg!(feature = "rustls") => Ok(url),
            "https" => Err(Error::TlsDisabled(self.url.clone())),
            other => Err(Error::Build(format!(
                "unsupported URL scheme {other:?} in {:?}",
                self.url
            ))),
        }
    }

    /// One attempt, the body read in full: an answer cut short is no answer.
    async fn attempt(
        &self,
        url: Url,
        key: &HeaderValue,
        timeout: Duration,
    ) -> std::result::Result<Outcome, reqwest::Error> {
        let response = self
            .client
            .inner
            .http
            .request(self.method.clone(), url)
            .headers(self.headers.clone())
            .header(IDEMPOTENCY_KEY, key.clone())
            .body(self.body.clone())
            .timeout(timeout)
            .send()
            .await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?;
        Ok(Outcome {
            key: self.key.clone(),
            attempts: 0,
            status,
            headers,
            body,
        })
    }

    fn exhausted(&self, attempts: u32, reason: GiveUp, last: Failure) -> Error {
        Error::Exhausted {
            key: self.key.clone(),
            attempts,
            reason,
            last: Box::new(last),
        }
    }

    /// Turns a final answer into the result: 400 and 422 become typed errors, and a
    /// 410 `key-expired`.
    fn finish(&self, outcome: Outcome) -> Result<Outcome> {
        let gone = outcome.status == StatusCode::GONE;
        if !gone
            && !matches!(
                outcome.status,
                StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY
            )
        {
            return Ok(outcome);
        }
        let (kind, detail) = problem(&outcome);
        if gone && kind.as_deref() != Some("key-expired") {
            // The upstream's own 410: an answer like any other.
            return Ok(outcome);
        }
        let key = self.key.clone();
        let answer = Box::new(outcome);
        Err(match kind.as_deref() {
            Some("key-expired") => Error::KeyExpired {
                key,
                detail,
                answer,
            },
            Some("key-reused") => Error::KeyReused {
                key,
                detail,
                answer,
            },
            Some("invalid-key" | "missing-key") => Error::InvalidKey {
                key,
                detail,
                answer,
            },
            _ => Error::Rejected {
                key,
                status: answer.status,
                detail,
                answer,
            },
        })
    }
}

/// The header value for `key`: the bare form Stripe clients send, or the Structured
/// Field string when the bare form would be read differently (surrounding blanks, a
/// leading double quote).
pub(crate) fn key_header_value(key: &Key) -> HeaderValue {
    let s = key.as_str();
    let bare_reads_back =
        !s.starts_with('"') && !s.starts_with([' ', '\t']) && !s.ends_with([' ', '\t']);
    let value = if bare_reads_back {
        s.to_owned()
    } else {
        key.to_sf_string()
    };
    HeaderValue::from_str(&value).expect("a key is printable ASCII")
}

/// The RFC 9457 problem's `type` slug (the last path segment, as idem's server answers
/// `https://idem.dev/problems/key-reused`) and the best explanation the answer has.
fn problem(outcome: &Outcome) -> (Option<String>, String) {
    let json = outcome
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("json"));
    let parsed: Option<serde_json::Value> = json
        .then(|| serde_json::from_slice(&outcome.body).ok())
        .flatten();
    let field = |name: &str| {
        parsed
            .as_ref()
            .and_then(|v| v.get(name))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let slug = field("type").and_then(|t| {
        t.trim_end_matches('/')
            .rsplit('/')
            .next()
            .map(str::to_owned)
    });
    let detail = field("detail")
        .or_else(|| field("title"))
        .unwrap_or_else(|| {
            let text = outcome.text();
            let text = text.trim();
            if text.is_empty() {
                outcome
                    .status
                    .canonical_reason()
                    .unwrap_or("no explanation")
                    .to_owned()
            } else {
                text.chars().take(200).collect()
            }
        });
    (slug, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_header_reads_back_as_the_same_key() {
        for raw in [
            "8e03978e-40d5-43e8-bc93-6894a57f9324",
            " padded ",
            "\"quoted",
            "a\\b",
        ] {
            let key = Key::new(raw).unwrap();
            let value = key_header_value(&key);
            assert_eq!(Key::parse(value.as_bytes()).unwrap(), key, "{raw:?}");
        }
        let uuid = Key::new("8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap();
        assert_eq!(
            key_header_value(&uuid),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
    }

    #[test]
    fn content_type_is_sent_once() {
        let content_types = |op: &Operation| {
            op.header_map()
                .get_all(CONTENT_TYPE)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        let client = Client::new();
        let json_then_header = client
            .post("http://127.0.0.1:1/")
            .json(&serde_json::json!({"amount": 100}))
            .header("content-type", "application/vnd.api+json");
        assert_eq!(
            content_types(&json_then_header),
            ["application/vnd.api+json"]
        );
        let header_then_json = client
            .post("http://127.0.0.1:1/")
            .header("Content-Type", "application/vnd.api+json")
            .json(&serde_json::json!({"amount": 100}));
        assert_eq!(
            content_types(&header_then_json),
            ["application/vnd.api+json"]
        );
        let json_only = client.post("http://127.0.0.1:1/").json(&[1, 2]);
        assert_eq!(content_types(&json_only), ["application/json"]);
        // Other headers may repeat.
        let twice = client
            .post("http://127.0.0.1:1/")
            .header("x-tag", "a")
            .header("x-tag", "b");
        assert_eq!(twice.header_map().get_all("x-tag").iter().count(), 2);
    }

    #[test]
    fn idempotency_key_header_cannot_be_set_by_hand() {
        let op = Client::new()
            .post("http://127.0.0.1:1/")
            .header("Idempotency-Key", "per-attempt");
        let err = tokio_test_block_on(op.send()).unwrap_err();
        assert!(matches!(err, Error::Build(m) if m.contains("with_key")));
    }

    #[test]
    fn https_without_tls_is_refused_before_sending() {
        let op = Client::new().post("https://127.0.0.1:1/");
        let err = tokio_test_block_on(op.send()).unwrap_err();
        if cfg!(feature = "rustls") {
            assert!(!matches!(err, Error::TlsDisabled(_)));
        } else {
            assert!(matches!(err, Error::TlsDisabled(_)), "{err}");
        }
    }

    #[test]
    fn a_clone_is_the_same_operation() {
        let op = Client::new().post("http://127.0.0.1:1/");
        assert_eq!(op.clone().key(), op.key());
        let other = Client::new().post("http://127.0.0.1:1/");
        assert_ne!(other.key(), op.key());
    }

    fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }
}
