//! HTTP/2 on the listeners, beside HTTP/1.1 on the same port: the limits a client
//! cannot raise, and the connection builders they go into.
//!
//! A plain-TCP connection is HTTP/2 when it opens with the HTTP/2 preface (h2c with
//! prior knowledge, RFC 9113 §3.3), HTTP/1.1 otherwise; over TLS, ALPN decides. The
//! limits bound what one connection may make the gateway hold: streams at once, each
//! stream's header list, the answer bytes buffered per stream and per connection, and
//! the resets a client may provoke (the "rapid reset" flood of CVE-2023-44487 opens and cancels streams
//! faster than the server can notice).

use std::time::Duration;

use hyper_util::rt::TokioTimer;
use hyper_util::server::conn::auto;

use super::window::StreamExecutor;

/// Streams one HTTP/2 connection may have open at once unless configured otherwise.
pub(crate) const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;

/// The largest header list (RFC 9113 §6.5.2, decoded names and values plus 32 bytes per
/// field) an HTTP/2 request may carry unless configured otherwise.
pub(crate) const DEFAULT_MAX_HEADER_LIST_SIZE: u32 = 32 * 1024;

/// How often an HTTP/2 connection is pinged unless configured otherwise.
pub(crate) const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a ping may go unanswered before the connection is closed, unless
/// configured otherwise.
pub(crate) const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Streams a client may open and reset before the gateway has accepted them: beyond
/// this, the connection is closed with `ENHANCE_YOUR_CALM` (the rapid-reset flood).
pub(crate) const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// Streams the gateway may have to reset because of the client's errors, on one
/// connection, before it closes the connection.
pub(crate) const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 256;

/// The most one HTTP/1.1 connection's read buffer grows to. A request head must fit in
/// it (a larger one is 431, as Envoy's 60 KiB default would), and a body is read
/// through it, so that a connection whose request waits (for its upstream, or as a
/// duplicate for another attempt's answer) holds no more than this of its reading;
/// hyper's own default is about 400 KiB.
pub(crate) const HTTP1_MAX_BUF_SIZE: usize = 64 * 1024;

/// Answer bytes buffered for one stream ahead of the client's flow-control window.
pub(crate) const MAX_SEND_BUF_SIZE: usize = 128 * 1024;

/// Bytes of buffered answers (replays, recorded answers) one HTTP/2 connection may
/// hold unless configured otherwise: two answers at the default response limit.
pub(crate) const DEFAULT_ANSWER_BUDGET: usize = 16 * 1024 * 1024;

/// The HTTP/2 limits of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Limits {
    /// Streams one connection may have open at once.
    pub(crate) max_concurrent_streams: u32,
    /// The largest header list a request may carry, in bytes.
    pub(crate) max_header_list_size: u32,
    /// How often an idle connection is pinged; `None` for never.
    pub(crate) keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed.
    pub(crate) keepalive_timeout: Duration,
    /// The most bytes of buffered answers one connection may hold at once; an answer
    /// beyond them is refused (a connection's first answer always fits). Held by the
    /// proxy's front, which knows which answers are buffered.
    pub(crate) answer_budget: usize,
}

impl Default for Http2Limits {
    fn default() -> Self {
        Http2Limits {
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_header_list_size: DEFAULT_MAX_HEADER_LIST_SIZE,
            keepalive_interval: Some(DEFAULT_KEEPALIVE_INTERVAL),
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            answer_budget: DEFAULT_ANSWER_BUDGET,
        }
    }
}

/// The connection builders of a listener: either protocol as the connection's first
/// bytes say, or one of them as ALPN chose.
#[derive(Clone)]
pub(super) struct Builders {
    pub(super) auto: auto::Builder<StreamExecutor>,
    pub(super) http1: auto::Builder<StreamExecutor>,
    pub(super) http2: auto::Builder<StreamExecutor>,
}

impl Builders {
    /// Builders with `header_read_timeout` for each HTTP/1.1 request's head, and as
    /// the longest an HTTP/2 answer may wait for room in its client's window, and
    /// `limits` on HTTP/2.
    pub(super) fn new(header_read_timeout: Option<Duration>, limits: &Http2Limits) -> Builders {
        let mut auto = auto::Builder::new(StreamExecutor::new(header_read_timeout));
        auto.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .max_buf_size(HTTP1_MAX_BUF_SIZE);
        auto.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams)
            .max_header_list_size(limits.max_header_list_size)
            .keep_alive_interval(limits.keepalive_interval)
            .keep_alive_timeout(limits.keepalive_timeout)
            .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
            .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS)
            .max_send_buf_size(MAX_SEND_BUF_SIZE);
        Builders {
            http1: auto.clone().http1_only(),
            http2: auto.clone().http2_only(),
            auto,
        }
    }
}
