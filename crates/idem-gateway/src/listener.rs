//! Accepting and serving connections, for the proxy and the admin listener alike: each
//! listener holds at most so many connections open, every connection has the client
//! timeout, and the process's file descriptors are budgeted between them.
//!
//! **The cap.** At its cap a listener stops accepting until one of its connections
//! closes; connections that arrive meanwhile wait in the kernel's listen backlog, which
//! completes their handshake without a file descriptor of the gateway's. So no flood of
//! connections, however idle, runs the process out of descriptors (an `accept` failing
//! with `EMFILE`, upstream and store connections failing with it), and the admin
//! listener, capped at [`ADMIN_MAX_CONNECTIONS`], can never starve the proxy. A
//! connection that became a WebSocket tunnel keeps its place until the tunnel closes.
//!
//! **The proxy's default cap** is derived from the file-descriptor limit, which `idem
//! serve` first raises from its soft value to the hard one ([`raise_fd_limit`]): see
//! [`default_max_connections`].
//!
//! **The client timeout.** A connection must send each request's head within the
//! timeout, counted from when it is ready for its next request, so an idle keep-alive
//! connection is closed after it too. And a client that stops reading is closed once
//! the gateway's writes to it have made no progress for the timeout, so it cannot hold
//! its connection, its place under the cap and the answer's buffers for ever by asking
//! for an answer and never reading it.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;

use crate::metrics::{GaugeGuard, Metrics};
use crate::proxy::BoxError;
use crate::serve::KEEPALIVE_IDLE;

/// The most connections the admin listener holds open: plenty for probes, scrapes and
/// an operator, and few enough that it never takes the proxy's descriptors.
pub const ADMIN_MAX_CONNECTIONS: usize = 32;

/// Descriptors kept out of the proxy's default cap beyond the store's and the admin
/// listener's: the listeners themselves, standard streams, DNS lookups, files the store
/// opens besides its connections, and room to spare.
pub const SPARE_DESCRIPTORS: u64 = 64;

/// The listen backlog asked of the kernel (which caps it at `net.core.somaxconn` on
/// Linux): connections wait there, handshake done, while a listener is at its cap. With
/// the usual 128, a burst beyond it would have its handshakes dropped and retried.
pub const LISTEN_BACKLOG: u32 = 1024;

/// The first pause after an `accept` that failed; each further failure in a row doubles
/// it, up to [`ACCEPT_PAUSE_MAX`].
const ACCEPT_PAUSE_MIN: Duration = Duration::from_millis(50);

/// The longest pause after an `accept` that failed.
const ACCEPT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Which of the gateway's listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    /// The proxy's (`--listen`).
    Proxy,
    /// The admin listener's (`--admin`).
    Admin,
}

impl ListenerKind {
    /// Both, in the order metrics list them.
    pub const ALL: [ListenerKind; 2] = [ListenerKind::Proxy, ListenerKind::Admin];

    /// The label in metrics and logs: `proxy` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            ListenerKind::Proxy => "proxy",
            ListenerKind::Admin => "admin",
        }
    }

    /// The position in [`ListenerKind::ALL`].
    pub(crate) fn index(self) -> usize {
        match self {
            ListenerKind::Proxy => 0,
            ListenerKind::Admin => 1,
        }
    }
}

/// Raises the soft limit on open files (`RLIMIT_NOFILE`) to the hard limit, as servers
/// commonly do, and returns the soft limit then in force; `None` where it cannot be
/// read. A failure to raise it is logged and leaves it as it was.
pub fn raise_fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let (soft, hard) = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
            Ok(limits) => limits,
            Err(e) => {
                tracing::warn!(error = %e, "the open-file limit could not be read");
                return None;
            }
        };
        match rlimit::increase_nofile_limit(hard) {
            Ok(now) => Some(now),
            Err(e) => {
                tracing::warn!(error = %e, soft, hard, "the open-file limit could not be raised");
                Some(soft)
            }
        }
    }
    #[cfg(not(unix))]
    None
}

/// The soft limit on open files now; `None` where it cannot be read.
pub fn fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rlimit::getrlimit(rlimit::Resource::NOFILE)
            .ok()
            .map(|(soft, _)| soft)
    }
    #[cfg(not(unix))]
    None
}

/// The proxy's connection cap when `--max-connections` is not given, for a process that
/// may open `nofile` files:
///
/// ```text
/// (nofile - store - admin - SPARE_DESCRIPTORS) / 2, at least 1
/// ```
///
/// where `store` is what the store's connections may hold
/// ([`store::descriptors`](crate::store::descriptors)), `admin` is
/// [`ADMIN_MAX_CONNECTIONS`] when the admin listener is on, and the halving leaves each
/// client connection room for the upstream connection it may hold while its request is
/// forwarded. At the usual hard limit of 1 048 576 that is about half a million; at a
/// limit of 1 024 with the SQLite store and the admin listener, 452.
pub fn default_max_connections(nofile: u64, store: u64, admin: bool) -> usize {
    let admin = if admin {
        ADMIN_MAX_CONNECTIONS as u64
    } else {
        0
    };
    let left = nofile
        .saturating_sub(store)
        .saturating_sub(admin)
        .saturating_sub(SPARE_DESCRIPTORS);
    usize::try_from(left / 2).unwrap_or(usize::MAX).max(1)
}

/// A connection's place under its listener's cap: held by the connection's task, and by
/// a WebSocket tunnel the connection became, until the last of them ends. The proxy
/// finds it in the extensions of requests that ask for an upgrade.
#[derive(Clone, Debug)]
pub struct ConnectionSlot(#[allow(dead_code, reason = "held for its drop")] Arc<Slot>);

#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    _open: GaugeGuard,
}

/// A bound listener with its cap and client timeout.
pub(crate) struct Listener {
    tcp: TcpListener,
    kind: ListenerKind,
    slots: Arc<Semaphore>,
    max: usize,
    header_read_timeout: Option<Duration>,
    metrics: Arc<Metrics>,
}

impl Listener {
    /// Serves `tcp` as the `kind` listener, with at most `max` connections open (at
    /// least 1) and `header_read_timeout` for each request's head.
    pub(crate) fn new(
        tcp: TcpListener,
        kind: ListenerKind,
        max: usize,
        header_read_timeout: Option<Duration>,
        metrics: Arc<Metrics>,
    ) -> Listener {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        metrics.set_max_connections(kind, max);
        Listener {
            tcp,
            kind,
            slots: Arc::new(Semaphore::new(max)),
            max,
            header_read_timeout,
            metrics,
        }
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The most connections it holds open.
    pub(crate) fn max_connections(&self) -> usize {
        self.max
    }

    /// Accepts connections until `shutdown` resolves, serving each with the service
    /// `service_for` makes for its peer, then stops listening. Returns the connections
    /// still open, for [`Connections::finish`].
    pub(crate) async fn run<F, S, B>(
        self,
        mut service_for: F,
        shutdown: impl Future<Output = ()>,
    ) -> Connections
    where
        F: FnMut(SocketAddr, &ConnectionSlot) -> S,
        S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let connections = Connections::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut pause = ACCEPT_PAUSE_MIN;
        let label = self.kind.as_str();
        loop {
            let permit = match self.slots.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => {
                    self.metrics.count_connection_wait(self.kind);
                    tracing::debug!(
                        listener = label,
                        max = self.max,
                        "at the connection cap; accepting again once a connection closes"
                    );
                    tokio::select! {
                        () = &mut shutdown => break,
                        permit = self.slots.clone().acquire_owned() => {
                            permit.expect("the semaphore is never closed")
                        }
                    }
                }
            };
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.tcp.accept() => match accepted {
                    Ok(conn) => {
                        pause = ACCEPT_PAUSE_MIN;
                        conn
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: pause, longer each time
                        // in a row, and keep serving what is open.
                        self.metrics.count_accept_error(self.kind);
                        tracing::warn!(
                            listener = label,
                            error = %e,
                            pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                            "accept failed"
                        );
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = tokio::time::sleep(pause) => {}
                        }
                        pause = (pause * 2).min(ACCEPT_PAUSE_MAX);
                        continue;
                    }
                },
            };
            let slot = ConnectionSlot(Arc::new(Slot {
                _permit: permit,
                _open: self.metrics.connection_guard(self.kind),
            }));
            let service = service_for(peer, &slot);
            connections.serve(stream, service, self.header_read_timeout, slot);
        }
        connections
    }
}

/// Binds a listener on `addr` with [`LISTEN_BACKLOG`].
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As the standard library's bind does: a restarted gateway can bind its port while
    // connections of the previous one linger in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Turns TCP keepalive on for `stream`, so that a peer that vanished without closing
/// (a client whose network dropped) is found out and its connection closed. An idle
/// HTTP connection has the client timeout for that; a WebSocket tunnel has nothing else.
pub(crate) fn keep_alive(stream: &TcpStream) -> std::io::Result<()> {
    let params = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    socket2::SockRef::from(stream).set_tcp_keepalive(&params)
}

/// A client connection whose writes fail once they have made no progress for `timeout`
/// (the client timeout): its client has stopped reading. Reads pass through untouched;
/// a WebSocket tunnel the connection becomes keeps the bound on its writes to the
/// client.
pub(crate) struct WriteStall<S> {
    io: S,
    timeout: Option<Duration>,
    /// Armed by a write that could not go on, disarmed by one that did. Boxed, so that
    /// the stream stays `Unpin`; made at the first stall.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

impl<S> WriteStall<S> {
    /// `io`, whose writes fail after `timeout` without progress; `None` for no bound.
    pub(crate) fn new(io: S, timeout: Option<Duration>) -> WriteStall<S> {
        WriteStall {
            io,
            timeout,
            stalled: None,
            armed: false,
        }
    }

    /// What a write's `poll` gave, with the stall bound applied: `Pending` arms the
    /// timer (if it is not armed yet) and becomes a `TimedOut` error once it fires.
    fn bound<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let Some(timeout) = self.timeout else {
            return polled;
        };
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        let deadline = Instant::now() + timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            stalled.as_mut().reset(deadline);
            self.armed = true;
        }
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for the client timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStall<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStall<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.bound(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.bound(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.bound(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.bound(cx, polled)
    }
}

impl<S> std::fmt::Debug for WriteStall<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteStall")
            .field("timeout", &self.timeout)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

/// The connections one listener serves, asked to finish together at shutdown.
pub(crate) struct Connections {
    stop: watch::Sender<bool>,
    // Each connection's task holds a sender; `open` ends when the last task has.
    open_tx: mpsc::Sender<()>,
    open: mpsc::Receiver<()>,
}

impl Connections {
    fn new() -> Connections {
        let (stop, _) = watch::channel(false);
        let (open_tx, open) = mpsc::channel(1);
        Connections {
            stop,
            open_tx,
            open,
        }
    }

    /// Serves one connection in a task of its own, holding `slot` until it ends.
    fn serve<S, B>(
        &self,
        stream: TcpStream,
        service: S,
        header_read_timeout: Option<Duration>,
        slot: ConnectionSlot,
    ) where
        S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let _ = stream.set_nodelay(true);
        if let Err(e) = keep_alive(&stream) {
            tracing::debug!(error = %e, "TCP keepalive could not be set on a connection");
        }
        // A client that sends no complete request head in time (a slow or stalled one,
        // or an idle keep-alive connection) is disconnected, so it cannot hold a
        // connection and its buffers without limit. With upgrades, so that the proxy can
        // hand a switched connection (a WebSocket) over to its tunnel.
        let stream = WriteStall::new(stream, header_read_timeout);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut stopping = self.stop.subscribe();
        let open = self.open_tx.clone();
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                biased;
                ended = conn.as_mut() => ended,
                _ = async { stopping.wait_for(|stop| *stop).await.map(drop) } => {
                    // Finish the request in progress, if any, then close.
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
            drop(open);
        });
    }

    /// Asks every connection to finish its request in progress and close, and waits
    /// until all have, or `deadline`; whether all had.
    pub(crate) async fn finish(self, deadline: Instant) -> bool {
        let Connections {
            stop,
            open_tx,
            mut open,
        } = self;
        stop.send_replace(true);
        drop(open_tx);
        tokio::time::timeout_at(deadline, open.recv()).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_get_tcp_keepalive() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        let (accepted, _) = accepted.unwrap();
        let socket = socket2::SockRef::from(&accepted);
        assert!(
            !socket.keepalive().unwrap(),
            "off until the listener sets it"
        );
        keep_alive(&accepted).unwrap();
        assert!(socket.keepalive().unwrap());
        drop(client);
    }

    #[tokio::test]
    async fn listeners_have_a_backlog_beyond_the_usual_128() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        // Nothing accepts: every connection past the backlog would hang in its handshake.
        let mut waiting = Vec::new();
        for _ in 0..300 {
            let connect = TcpStream::connect(addr);
            let stream = tokio::time::timeout(Duration::from_secs(5), connect)
                .await
                .expect("the handshake completes from the backlog")
                .unwrap();
            waiting.push(stream);
        }
        drop(listener);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_that_make_no_progress_fail_after_the_timeout_and_progress_rearms_it() {
        use tokio::io::AsyncWriteExt;
        let (near, mut far) = tokio::io::duplex(8);
        let mut near = WriteStall::new(near, Some(Duration::from_secs(30)));
        // The far side reads some, late but within the timeout: the writes go on.
        let writing = tokio::spawn(async move {
            let sent = near.write_all(&[7; 64]).await;
            (near, sent)
        });
        let mut buf = [0u8; 64];
        let mut read = 0;
        while read < 64 {
            tokio::time::sleep(Duration::from_secs(20)).await;
            read += tokio::io::AsyncReadExt::read(&mut far, &mut buf)
                .await
                .unwrap();
        }
        let (mut near, sent) = writing.await.unwrap();
        sent.expect("progress within the timeout each time");
        // Now it reads nothing: the write fails once 30 s have passed without progress.
        let started = Instant::now();
        let e = near.write_all(&[7; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        drop(far);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_timeout_writes_wait_as_long_as_they_must() {
        use tokio::io::AsyncWriteExt;
        let (near, _far) = tokio::io::duplex(8);
        let mut near = WriteStall::new(near, None);
        let write = near.write_all(&[7; 64]);
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), write)
                .await
                .is_err()
        );
    }

    #[test]
    fn the_default_cap_leaves_room_for_upstream_store_and_admin_connections() {
        // SQLite's default pool (8 connections, 3 files each) and the admin listener.
        assert_eq!(
            default_max_connections(1024, 24, true),
            (1024 - 24 - 32 - 64) / 2
        );
        assert_eq!(default_max_connections(1024, 24, true), 452);
        assert_eq!(default_max_connections(1024, 0, false), 480);
        assert_eq!(default_max_connections(1_048_576, 10, true), 524_235);
        // Never none, however few descriptors there are.
        assert_eq!(default_max_connections(50, 24, true), 1);
        assert_eq!(default_max_connections(0, 0, false), 1);
    }
}
