//! The checker's HTTP side: one target, a request budget, a deadline, and the evidence
//! (each request and answer, credentials redacted, with when it was in flight) that
//! every probe reports.
//!
//! Every request goes on a connection of its own, over TCP or (for `https://`) TLS.
//! Most are sent by hyper; the probes that must control the bytes on the wire (a last
//! byte held back until every parallel request is written, a hang-up before the answer)
//! write theirs by hand and read the answer with [`raw`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

pub(crate) mod evidence;
mod raw;

pub use evidence::{Exchange, Timing};

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

/// The content type of a form body.
pub const FORM: &str = "application/x-www-form-urlencoded";

/// What the body is, which decides how the probes change it.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyKind {
    /// JSON, parsed.
    Json(Value),
    /// `application/x-www-form-urlencoded`.
    Form,
    /// Anything else: sent as given, never rewritten into an equivalent.
    Other,
}

/// The API under test, as the command line described it.
#[derive(Debug)]
pub struct Target {
    /// The one URL every request goes to.
    pub uri: Uri,
    /// `host:port` of the URL, to connect to.
    pub authority: String,
    /// The host, for TLS's server name.
    pub host: String,
    /// TLS settings for an `https://` URL.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The method of every request.
    pub method: Method,
    /// The `--header`s, in order.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The request body.
    pub body: Bytes,
    /// What the body is.
    pub kind: BodyKind,
    /// `--id-pointer`: where the resource id is in an answer's JSON body.
    pub id_pointer: Option<String>,
    /// `--other-tenant-header`: replaces the header of the same name in the tenants probe.
    pub other_tenant: Option<(HeaderName, HeaderValue)>,
    /// `--profile mcp`: every request carries a fresh JSON-RPC `id` and accepts JSON and
    /// an event stream alike, as an MCP client does.
    pub rpc: bool,
}

impl Target {
    /// Whether `name`'s values are credentials, never shown in a report.
    pub fn is_secret(&self, name: &HeaderName) -> bool {
        let n = name.as_str();
        SECRET_HEADERS.contains(&n)
            || (SECRET_NAME_PARTS.iter().any(|p| n.contains(p)) && n != "idempotency-key")
            || self.other_tenant.as_ref().is_some_and(|(o, _)| o == name)
    }

    fn typed(&self) -> bool {
        self.headers
            .iter()
            .any(|(n, _)| n == http::header::CONTENT_TYPE)
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
    /// The JSON-RPC `id` the request carried, when the checker gave it one
    /// (`--profile mcp`).
    pub request_id: Option<u64>,
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

    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The resource id at `pointer` in the JSON body, as text.
    pub fn id(&self, pointer: &str) -> Option<String> {
        match self.json()?.pointer(pointer)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    }
}

/// Why a probe stopped before it could judge.
#[derive(Debug, Clone)]
pub struct Stop(pub String);

/// A connection to the target: TCP, or TLS over it.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The requests of one run: shared budget, deadline and per-request timeout.
pub struct Session {
    /// The API under test.
    pub target: Target,
    sent: AtomicU32,
    /// The last JSON-RPC `id` given to a request (`--profile mcp`).
    rpc_id: AtomicU64,
    max_requests: u32,
    timeout: Duration,
    started: Instant,
    deadline: Instant,
    max_total: Duration,
}

/// A parallel request's arrival at the barrier: said once, when its partial request is
/// written or when it cannot be, so that the others are never kept waiting for it.
pub struct Arrival(Option<mpsc::UnboundedSender<()>>);

impl Arrival {
    /// An arrival reported on `tx`.
    pub fn new(tx: mpsc::UnboundedSender<()>) -> Arrival {
        Arrival(Some(tx))
    }

    fn arrive(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        self.arrive();
    }
}

impl Session {
    /// A session against `target`, at most `max_requests` requests, each answered within
    /// `timeout`, all of them within `total`.
    pub fn new(target: Target, max_requests: u32, timeout: Duration, total: Duration) -> Session {
        let now = Instant::now();
        Session {
            target,
            sent: AtomicU32::new(0),
            rpc_id: AtomicU64::new(0),
            max_requests,
            timeout,
            started: now,
            deadline: now + total,
            max_total: total,
        }
    }

    /// Requests sent (or begun) so far.
    pub fn sent(&self) -> u32 {
        self.sent.load(Ordering::SeqCst)
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.started).as_micros()).unwrap_or(u64::MAX)
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

    /// A new connection to the target, TLS for an `https://` URL.
    pub async fn connect(&self) -> Result<Box<dyn Io>, String> {
        let tcp = tokio::net::TcpStream::connect(&self.target.authority)
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.target.authority))?;
        let _ = tcp.set_nodelay(true);
        let Some(config) = &self.target.tls else {
            return Ok(Box::new(tcp));
        };
        let name = rustls::pki_types::ServerName::try_from(self.target.host.clone())
            .map_err(|e| format!("{:?} is no TLS server name: {e}", self.target.host))?;
        let tls = tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("the TLS handshake with {} failed: {e}", self.target.host))?;
        Ok(Box::new(tls))
    }

    /// The `Host` of every request: the URL's authority as written.
    fn host_header(&self) -> String {
        self.target
            .uri
            .authority()
            .map_or_else(|| self.target.authority.clone(), |a| a.to_string())
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
        if !t.typed() {
            let content_type = match t.kind {
                BodyKind::Json(_) => Some("application/json"),
                BodyKind::Form => Some(FORM),
                BodyKind::Other => None,
            };
            if let Some(ct) = content_type {
                out.push((http::header::CONTENT_TYPE, HeaderValue::from_static(ct)));
            }
        }
        // An MCP client accepts both framings of an answer (Streamable HTTP).
        if t.rpc && !t.headers.iter().any(|(n, _)| n == http::header::ACCEPT) {
            out.push((
                http::header::ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
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

    /// Sends `req` and reads the whole answer; the exchange is the evidence either way.
    pub async fn send(&self, label: &str, req: &Req) -> (Exchange, Result<Answer, Stop>) {
        let (exchange, body, headers, rpc_id) = self.exchange(label, req);
        let timeout = match self.take() {
            Ok(t) => t,
            Err(stop) => return self.ended(exchange, None, rpc_id, Err(stop)),
        };
        let path = self.target.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut builder = http::Request::builder()
            .method(self.target.method.clone())
            .uri(path)
            .header(http::header::HOST, self.host_header());
        for (n, v) in headers {
            builder = builder.header(n, v);
        }
        let request = match builder.body(Full::new(body)) {
            Ok(r) => r,
            Err(e) => {
                let stop = Stop(format!("the request cannot be built: {e}"));
                return self.ended(exchange, None, rpc_id, Err(stop));
            }
        };
        let sent = Instant::now();
        let read = async {
            let io = self.connect().await?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
                .await
                .map_err(|e| error_chain(&e))?;
            let exchange = async move {
                let res = sender
                    .send_request(request)
                    .await
                    .map_err(|e| error_chain(&e))?;
                let head = Instant::now();
                let status = res.status().as_u16();
                let headers = res.headers().clone();
                let body = res
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| format!("reading the answer's body: {e}"))?
                    .to_bytes();
                // The one request is answered: dropping the sender lets the connection end.
                drop(sender);
                let answer = Answer {
                    status,
                    headers,
                    body,
                    received: Instant::now(),
                    request_id: None,
                };
                Ok::<_, String>((answer, head))
            };
            let (answer, _) = futures_util::future::join(exchange, conn).await;
            answer
        };
        let result = match tokio::time::timeout(timeout, read).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(Stop(format!("the request failed: {e}"))),
            Err(_) => Err(Stop(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            ))),
        };
        self.ended(exchange, Some(sent), rpc_id, result)
    }

    /// The bytes of `req` on the wire, written by hand: HTTP/1.1, `Connection: close`.
    fn raw_request(&self, headers: &[(HeaderName, HeaderValue)], body: &Bytes) -> Vec<u8> {
        let path = self.target.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut raw = format!(
            "{} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\nconnection: close\r\n",
            self.target.method,
            self.host_header(),
            body.len()
        )
        .into_bytes();
        for (n, v) in headers {
            raw.extend_from_slice(n.as_str().as_bytes());
            raw.extend_from_slice(b": ");
            raw.extend_from_slice(v.as_bytes());
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"\r\n");
        raw.extend_from_slice(body);
        raw
    }

    /// Sends `req` with its last byte held back: writes all the rest, reports its
    /// `arrival`, waits until `go` says every parallel request has arrived, then writes
    /// the last byte and reads the answer. The server cannot act on the request before
    /// the release, so requests released together are in flight together.
    pub async fn send_held(
        &self,
        label: &str,
        req: &Req,
        mut arrival: Arrival,
        mut go: watch::Receiver<bool>,
    ) -> (Exchange, Result<Answer, Stop>) {
        let (exchange, body, headers, rpc_id) = self.exchange(label, req);
        let timeout = match self.take() {
            Ok(t) => t,
            Err(stop) => return self.ended(exchange, None, rpc_id, Err(stop)),
        };
        let raw = self.raw_request(&headers, &body);
        let (all_but_last, last) = raw.split_at(raw.len() - 1);
        let mut sent = None;
        let exchange_io = async {
            let mut io = self.connect().await?;
            sent = Some(Instant::now());
            let write = async {
                io.write_all(all_but_last).await?;
                io.flush().await
            };
            write
                .await
                .map_err(|e| format!("writing the request: {e}"))?;
            arrival.arrive();
            go.wait_for(|released| *released)
                .await
                .map_err(|_| "the parallel requests were never released".to_owned())?;
            let write = async {
                io.write_all(last).await?;
                io.flush().await
            };
            write
                .await
                .map_err(|e| format!("writing the request's last byte: {e}"))?;
            raw::read_answer(&mut io, &self.target.method).await
        };
        let result = match tokio::time::timeout(timeout, exchange_io).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(Stop(format!("the request failed: {e}"))),
            Err(_) => Err(Stop(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            ))),
        };
        drop(arrival);
        self.ended(exchange, sent, rpc_id, result)
    }

    /// Writes `req` on a fresh connection and closes it before reading anything: a
    /// client whose answer was lost.
    pub async fn send_and_hang_up(&self, label: &str, req: &Req) -> (Exchange, Result<(), Stop>) {
        let (mut exchange, body, headers, _) = self.exchange(label, req);
        let timeout = match self.take() {
            Ok(t) => t,
            Err(stop) => {
                exchange.error = Some(stop.0.clone());
                return (exchange, Err(stop));
            }
        };
        let raw = self.raw_request(&headers, &body);
        let sent = Instant::now();
        let write = async {
            let mut io = self.connect().await?;
            let write = async {
                io.write_all(&raw).await?;
                io.flush().await?;
                io.shutdown().await
            };
            write.await.map_err(|e| e.to_string())?;
            drop(io);
            Ok::<_, String>(())
        };
        exchange.timing = Some(Timing {
            sent_us: self.micros(sent),
            answered_us: None,
        });
        match tokio::time::timeout(timeout, write).await {
            Ok(Ok(())) => {
                exchange.error =
                    Some("the connection was closed before reading the answer".to_owned());
                (exchange, Ok(()))
            }
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

/// An error and its sources, as one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    msg
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

#[cfg(test)]
mod tests;
