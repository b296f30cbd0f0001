//! The evidence a probe reports: each request and answer as the report shows them,
//! credentials redacted, with when it was in flight.

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use serde::Serialize;

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Answer, EVIDENCE_BODY_CHARS, REDACTED, Req, Session, Stop};

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
    /// When the request was in flight, if it was sent.
    pub timing: Option<Timing>,
}

/// When a request was in flight, in microseconds since the run began: from its first
/// byte sent until its answer's head was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Timing {
    /// Its first byte was sent (or about to be).
    pub sent_us: u64,
    /// Its answer's head was read; `None` when no answer was read.
    pub answered_us: Option<u64>,
}

impl Timing {
    /// Whether two requests were in flight at one instant: their intervals intersect.
    /// A request with no answer is in flight from its first byte on.
    pub fn overlaps(&self, other: &Timing) -> bool {
        let end = |t: &Timing| t.answered_us.unwrap_or(u64::MAX);
        self.sent_us <= end(other) && other.sent_us <= end(self)
    }
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

impl Session {
    pub(super) fn show_request(
        &self,
        headers: &[(HeaderName, HeaderValue)],
        body: &Bytes,
    ) -> ShownRequest {
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

    pub(super) fn show_value(&self, name: &HeaderName, value: &HeaderValue) -> String {
        if self.target.is_secret(name) {
            REDACTED.to_owned()
        } else {
            String::from_utf8_lossy(value.as_bytes()).into_owned()
        }
    }

    pub(super) fn show_answer(&self, a: &Answer) -> ShownResponse {
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

    /// The evidence of `req` before it is sent, its body and headers, and the JSON-RPC
    /// `id` its body was given (`--profile mcp`: a fresh one for every request).
    pub(super) fn exchange(
        &self,
        label: &str,
        req: &Req,
    ) -> (Exchange, Bytes, Vec<(HeaderName, HeaderValue)>, Option<u64>) {
        let mut body = req.body.clone().unwrap_or_else(|| self.target.body.clone());
        let mut rpc_id = None;
        if self.target.rpc {
            let id = self.rpc_id.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(with_id) = crate::rpc::with_id(&body, id) {
                body = Bytes::from(with_id);
                rpc_id = Some(id);
            }
        }
        let headers = self.headers(req);
        let exchange = Exchange {
            label: label.to_owned(),
            request: self.show_request(&headers, &body),
            response: None,
            error: None,
            timing: None,
        };
        (exchange, body, headers, rpc_id)
    }

    /// Records how an exchange ended: its answer, or why there is none.
    pub(super) fn ended(
        &self,
        mut exchange: Exchange,
        sent: Option<Instant>,
        rpc_id: Option<u64>,
        result: Result<(Answer, Instant), Stop>,
    ) -> (Exchange, Result<Answer, Stop>) {
        let answered = result.as_ref().ok().map(|(_, head)| self.micros(*head));
        exchange.timing = sent.map(|at| Timing {
            sent_us: self.micros(at),
            answered_us: answered,
        });
        match result {
            Ok((mut answer, _)) => {
                answer.request_id = rpc_id;
                exchange.response = Some(self.show_answer(&answer));
                (exchange, Ok(answer))
            }
            Err(stop) => {
                exchange.error = Some(stop.0.clone());
                (exchange, Err(stop))
            }
        }
    }
}

/// A body as the evidence shows it: text (lossy), cut at [`EVIDENCE_BODY_CHARS`].
pub(super) fn shown_body(body: &Bytes) -> String {
    let text = String::from_utf8_lossy(body);
    let count = text.chars().count();
    if count <= EVIDENCE_BODY_CHARS {
        text.into_owned()
    } else {
        let cut: String = text.chars().take(EVIDENCE_BODY_CHARS).collect();
        format!("{cut}… ({} more characters)", count - EVIDENCE_BODY_CHARS)
    }
}
