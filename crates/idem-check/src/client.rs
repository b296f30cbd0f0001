//! The checker's HTTP side: one target, a request budget, a deadline, and the evidence
//! (each request and answer, credentials redacted) that every probe reports.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// How much of a body the evidence shows; comparisons use the whole body.
const EVIDENCE_BODY_CHARS: usize = 2000;

/// What the text of a redacted header value is replaced by.
pub const REDACTED: &str = "[redacted]";

/// Header names whose values are credentials, whatever the API: never shown.
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
];

/// Parts of header names that say the value is a credential.
const SECRET_NAME_PARTS: &[&str] = &["token", "secret", "password", "api-key", "apikey"];

/// The API under test, as the command line described it.
#[derive(Debug)]
pub struct Target {
    /// The one URL every request goes to.
    pub uri: Uri,
    /// `host:port` of the URL.
    pub authority: String,
    /// The method of every request.
    pub method: Method,
    /// The `--header`s, in order.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The request body.
    pub body: Bytes,
    /// The body, when it is JSON.
    pub json: Option<Value>,
    /// `--id-pointer`: where the resource id is in an answer's JSON body.
    pub id_pointer: Option<String>,
    /// `--other-tenant-header`: replaces the header of the same name in the tenants probe.
    pub other_tenant: Option<(HeaderName, HeaderValue)>,
}

impl Target {
    /// Whether `name`'s values are credentials, never shown in a report.
    pub fn is_secret(&self, name: &HeaderName) -> bool {
        let n = name.as_str();
        SECRET_HEADERS.contains(&n)
            || (SECRET_NAME_PARTS.iter().any(|p| n.contains(p)) && n != "idempotency-key")
            || self.other_tenant.as_ref().is_some_and(|(o, _)| o == name)
    }
}

/// One request a probe sends.
#[derive(Debug, Clone, Default)]
pub struct Req {
    /// The `Idempotency-Key` fields, as sent: none, one or (to test a refusal) two.
    pub keys: Vec<Vec<u8>>,
    /// Another body than the target's.
    pub body: Option<Bytes>,
    /// Send the other tenant's header instead of the same-named `--header`.
    pub other_tenant: bool,
}

impl Req {
    /// A request with one `Idempotency-Key` field.
    pub fn keyed(key: &str) -> Req {
        Req {
            keys: vec![key.as_bytes().to_vec()],
            ..Req::default()
        }
    }

    /// The same request with another body.
    pub fn with_body(mut self, body: impl Into<Bytes>) -> Req {
        self.body = Some(body.into());
        self
    }
}

/// An answer, read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Its status.
    pub status: u16,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
    /// When it was read.
    pub received: Instant,
}

impl Answer {
    /// A header's value as text (lossy).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    /// Whether the answer says it is a replay (`Idempotent-Replayed: true`).
    pub fn replay_marker(&self) -> bool {
        self.header("idempotent-replayed")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }

    /// Whether the status is 2xx.
    pub fn accepted(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The resource id at `pointer` in the JSON body, as text.
    pub fn id(&self, pointer: &str) -> Option<String> {
        let v: Value = serde_json::from_slice(&self.body).ok()?;
        match v.pointer(pointer)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    }
}

/// One request and what came of it, as a report shows them.
#[derive(Debug, Clone, Serialize)]
pub struct Exchange {
    /// What the probe sent it for.
    pub label: String,
    /// The request.
    pub request: ShownRequest,
    /// The answer, if one was read.
    pub response: Option<ShownResponse>,
    /// Why there is no answer.
    pub error: Option<String>,
}

/// A request as shown: credentials redacted, the body cut at 2000 characters.
#[derive(Debug, Clone, Serialize)]
pub struct ShownRequest {
    /// Its method.
    pub method: String,
    /// Its URL.
    pub url: String,
    /// Its headers, in order, as `[name, value]`.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: String,
}

/// An answer as shown: credentials redacted, the body cut at 2000 characters.
#[derive(Debug, Clone, Serialize)]
pub struct ShownResponse {
    /// Its status.
    pub status: u16,
    /// Its headers, in order, as `[name, value]`.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: String,
}

/// Why a probe stopped before it could judge.
#[derive(Debug, Clone)]
pub struct Stop(pub String);

/// The requests of one run: shared budget, deadline and per-request timeout.
pub struct Session {
    client: Client<HttpConnector, Full<Bytes>>,
    /// The API under test.
    pub target: Target,
    sent: AtomicU32,
    max_requests: u32,
    timeout: Duration,
    deadline: Instant,
    max_total: Duration,
}

impl Session {
    /// A session against `target`, at most `max_requests` requests, each answered within
    /// `timeout`, all of them within `total`.
    pub fn new(target: Target, max_requests: u32, timeout: Duration, total: Duration) -> Session {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        Session {
            client: Client::builder(TokioExecutor::new()).build(connector),
            target,
            sent: AtomicU32::new(0),
            max_requests,
            timeout,
            deadline: Instant::now() + total,
            max_total: total,
        }
    }

    /// Requests sent (or begun) so far.
    pub fn sent(&self) -> u32 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Takes one request from the budget, or says why not.
    fn take(&self) -> Result<Duration, Stop> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(Stop(format!(
                "stopped: the run's --total-timeout of {} is spent",
                humantime::format_duration(self.max_total)
            )));
        }
        let n = self.sent.fetch_add(1, Ordering::SeqCst);
        if n >= self.max_requests {
            self.sent.fetch_sub(1, Ordering::SeqCst);
            return Err(Stop(format!(
                "stopped: the budget of --max-requests {} is spent",
                self.max_requests
            )));
        }
        Ok(remaining.min(self.timeout))
    }

    /// Sleeps `d`, or less if the run's deadline comes first.
    pub async fn pause(&self, d: Duration) {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(d.min(remaining)).await;
    }

    /// The headers of `req`, in the order they are sent.
    fn headers(&self, req: &Req) -> Vec<(HeaderName, HeaderValue)> {
        let t = &self.target;
        let mut out = Vec::new();
        for (name, value) in &t.headers {
            match &t.other_tenant {
                Some((o, v)) if req.other_tenant && o == name => out.push((o.clone(), v.clone())),
                _ => out.push((name.clone(), value.clone())),
            }
        }
        if req.other_tenant
            && let Some((o, v)) = &t.other_tenant
            && !t.headers.iter().any(|(n, _)| n == o)
        {
            out.push((o.clone(), v.clone()));
        }
        if t.json.is_some()
            && !t
                .headers
                .iter()
                .any(|(n, _)| n == http::header::CONTENT_TYPE)
        {
            out.push((
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ));
        }
        for k in &req.keys {
            // The probes only build keys a header can carry (the control-character one
            // is a tab, which HTTP allows in a field value).
            if let Ok(v) = HeaderValue::from_bytes(k) {
                out.push((HeaderName::from_static("idempotency-key"), v));
            }
        }
        out
    }

    fn show_request(&self, headers: &[(HeaderName, HeaderValue)], body: &Bytes) -> ShownRequest {
        ShownRequest {
            method: self.target.method.to_string(),
            url: self.target.uri.to_string(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), self.show_value(n, v)))
                .collect(),
            body: shown_body(body),
        }
    }

    fn show_value(&self, name: &HeaderName, value: &HeaderValue) -> String {
        if self.target.is_secret(name) {
            REDACTED.to_owned()
        } else {
            String::from_utf8_lossy(value.as_bytes()).into_owned()
        }
    }

    fn show_answer(&self, a: &Answer) -> ShownResponse {
        ShownResponse {
            status: a.status,
            headers: a
                .headers
                .iter()
                .map(|(n, v)| (n.to_string(), self.show_value(n, v)))
                .collect(),
            body: shown_body(&a.body),
        }
    }

    /// Sends `req` and reads the whole answer; the exchange is the evidence either way.
    pub async fn send(&self, label: &str, req: &Req) -> (Exchange, Result<Answer, Stop>) {
        let body = req.body.clone().unwrap_or_else(|| self.target.body.clone());
        let headers = self.headers(req);
        let mut exchange = Exchange {
            label: label.to_owned(),
            request: self.show_request(&headers, &body),
            response: None,
            error: None,
        };
        let timeout = match self.take() {
            Ok(t) => t,
            Err(stop) => {
                exchange.error = Some(stop.0.clone());
                return (exchange, Err(stop));
            }
        };
        let mut builder = http::Request::builder()
            .method(self.target.method.clone())
            .uri(self.target.uri.clone());
        for (n, v) in headers {
            builder = builder.header(n, v);
        }
        let request = match builder.body(Full::new(body)) {
            Ok(r) => r,
            Err(e) => {
                let stop = Stop(format!("the request cannot be built: {e}"));
                exchange.error = Some(stop.0.clone());
                return (exchange, Err(stop));
            }
        };
        let read = async {
            let res = self.client.request(request).await.map_err(|e| {
                let mut msg = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    msg.push_str(&format!(": {s}"));
                    source = s.source();
                }
                msg
            })?;
            let status = res.status().as_u16();
            let headers = res.headers().clone();
            let body = res
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("reading the answer's body: {e}"))?
                .to_bytes();
            Ok::<_, String>(Answer {
                status,
                headers,
                body,
                received: Instant::now(),
            })
        };
        match tokio::time::timeout(timeout, read).await {
            Ok(Ok(answer)) => {
                exchange.response = Some(self.show_answer(&answer));
                (exchange, Ok(answer))
            }
            Ok(Err(e)) => {
                let stop = Stop(format!("the request failed: {e}"));
                exchange.error = Some(stop.0.clone());
                (exchange, Err(stop))
            }
            Err(_) => {
                let stop = Stop(format!(
                    "no answer within {}",
                    humantime::format_duration(timeout)
                ));
                exchange.error = Some(stop.0.clone());
                (exchange, Err(stop))
            }
        }
    }

    /// Writes `req` on a fresh TCP connection and closes it before reading anything: a
    /// client whose answer was lost.
    pub async fn send_and_hang_up(&self, label: &str, req: &Req) -> (Exchange, Result<(), Stop>) {
        let body = req.body.clone().unwrap_or_else(|| self.target.body.clone());
        let headers = self.headers(req);
        let mut exchange = Exchange {
            label: label.to_owned(),
            request: self.show_request(&headers, &body),
            response: None,
            error: Some("the connection was closed before reading the answer".to_owned()),
        };
        let timeout = match self.take() {
            Ok(t) => t,
            Err(stop) => {
                exchange.error = Some(stop.0.clone());
                return (exchange, Err(stop));
            }
        };
        let path = self
            .target
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let mut raw = format!(
            "{} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\nconnection: close\r\n",
            self.target.method,
            self.target.authority,
            body.len()
        )
        .into_bytes();
        for (n, v) in &headers {
            raw.extend_from_slice(n.as_str().as_bytes());
            raw.extend_from_slice(b": ");
            raw.extend_from_slice(v.as_bytes());
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"\r\n");
        raw.extend_from_slice(&body);
        let write = async {
            let mut stream = tokio::net::TcpStream::connect(&self.target.authority).await?;
            stream.write_all(&raw).await?;
            stream.flush().await?;
            stream.shutdown().await?;
            drop(stream);
            Ok::<_, std::io::Error>(())
        };
        match tokio::time::timeout(timeout, write).await {
            Ok(Ok(())) => (exchange, Ok(())),
            Ok(Err(e)) => {
                let stop = Stop(format!("the raw request failed: {e}"));
                exchange.error = Some(stop.0.clone());
                (exchange, Err(stop))
            }
            Err(_) => {
                let stop = Stop("the raw request could not be written in time".to_owned());
                exchange.error = Some(stop.0.clone());
                (exchange, Err(stop))
            }
        }
    }
}

/// A body as the evidence shows it: text (lossy), cut at [`EVIDENCE_BODY_CHARS`].
fn shown_body(body: &Bytes) -> String {
    let text = String::from_utf8_lossy(body);
    let count = text.chars().count();
    if count <= EVIDENCE_BODY_CHARS {
        text.into_owned()
    } else {
        let cut: String = text.chars().take(EVIDENCE_BODY_CHARS).collect();
        format!("{cut}… ({} more characters)", count - EVIDENCE_BODY_CHARS)
    }
}

/// A fresh key for one probe: `idem-check-` and 32 random hex digits.
pub fn new_key() -> String {
    let mut bytes = [0u8; 16];
    // With no system randomness, the clock still makes keys unique per run.
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        bytes = nanos.to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("idem-check-{hex}")
}
