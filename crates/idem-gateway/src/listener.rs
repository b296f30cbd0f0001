//! Accepting and serving connections, for the proxy and the admin listener alike: each
//! listener holds at most so many connections open, every connection has the client
//! timeout, and the process's file descriptors are budgeted between them.
//!
//! Three pieces, as in mini-redis: `Listener` runs the accept loop and holds the cap
//! as a semaphore; a `Handler` serves one connection in a task of its own; at
//! shutdown, `Connections` asks every connection to finish through the `Shutdown` each
//! holds, and waits until all have.
//!
//! **The cap.** At its cap a listener stops accepting until one of its connections
//! closes; connections that arrive meanwhile wait in the kernel's listen backlog, which
//! completes their handshake without a file descriptor of the gateway's. So no flood of
//! connections, however idle, runs the process out of descriptors (an `accept` failing
//! with `EMFILE`, upstream and store connections failing with it), and the admin
//! listener, capped at [`ADMIN_MAX_CONNECTIONS`], can never starve the proxy. A
//! connection that became a WebSocket tunnel keeps its place until the tunnel closes.
//!
//! **Reclaiming idle places.** The admin listener does not wait at its cap while its
//! places are held by idle sockets (a leaky scraper, a noisy neighbour): a connection
//! that arrives then is accepted, and the connection idle the longest (one with no
//! request in progress) is closed to make its room, as nginx reuses idle keep-alive
//! connections under `worker_connections` pressure. So an orchestrator's probe is
//! answered at once, not after the idle sockets' timeout. When every place has a
//! request in progress, it waits as the proxy does (see `reclaim.rs`).
//!
//! **The proxy's default cap** is derived from the file-descriptor limit, which `idem
//! serve` first raises from its soft value to the hard one ([`raise_fd_limit`]): see
//! [`default_max_connections`].
//!
//! **Protocols.** HTTP/1.1 and HTTP/2 on one port: a connection that opens with the
//! HTTP/2 preface is HTTP/2 (h2c with prior knowledge), any other HTTP/1.1; each HTTP/2
//! stream is one request to the service, as each HTTP/1.1 request is. HTTP/2 has the
//! limits of [`Http2Limits`].
//!
//! **The client timeout.** An HTTP/1.1 connection must send each request's head within
//! the timeout, counted from when it is ready for its next request, so an idle
//! keep-alive connection is closed after it too. Any connection with no request open
//! for the timeout is closed (gracefully: an HTTP/2 one gets a `GOAWAY`), which is what
//! bounds an HTTP/2 connection without streams, or one that never sends its preface.
//! And a client that stops reading is closed once
//! the gateway's writes to it have made no progress for the timeout, so it cannot hold
//! its connection, its place under the cap and the answer's buffers for ever by asking
//! for an answer and never reading it. Its HTTP/2 form, a client that reads its socket
//! but keeps a stream's flow-control window shut: an answer that has waited the timeout
//! for room in the window has its stream reset (its upstream connection or buffered
//! answer let go), and a connection whose every stream waits so is closed with a
//! `GOAWAY`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::BoxError;

use crate::metrics::{GaugeGuard, Metrics};

mod activity;
mod client_cert;
mod handler;
mod http2;
mod limits;
mod plain;
mod reclaim;
mod shutdown;
mod tls;
mod window;
mod write_stall;

pub(crate) use self::client_cert::{CertName, ClientNames};
use self::handler::Handler;
use self::http2::Builders;
pub(crate) use self::http2::Http2Limits;
pub use self::limits::default_max_connections;
pub(crate) use self::limits::{ADMIN_MAX_CONNECTIONS, fd_limit, raise_fd_limit};
use self::reclaim::Reclaim;
pub(crate) use self::shutdown::Connections;
pub(crate) use self::tls::{Tls, TlsError, TlsFiles};
pub(crate) use crate::metrics::ListenerKind;

/// How long a connection may stay silent before TCP starts asking whether its peer is
/// still there (client connections and upstream connections alike).
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);

/// The listen backlog asked of the kernel (which caps it at `net.core.somaxconn` on
/// Linux): connections wait there, handshake done, while a listener is at its cap. With
/// the usual 128, a burst beyond it would have its handshakes dropped and retried.
pub(crate) const LISTEN_BACKLOG: u32 = 1024;

/// The first pause after an `accept` that failed; each further failure in a row doubles
/// it, up to [`ACCEPT_PAUSE_MAX`].
const ACCEPT_PAUSE_MIN: Duration = Duration::from_millis(50);

/// The longest pause after an `accept` that failed.
const ACCEPT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// How often a listener that reclaims idle places, holding an arrival while every
/// place has a request in progress, looks again for one that has gone idle (a
/// connection going idle tells nobody: that would cost every request a wake-up).
const RECLAIM_RECHECK: Duration = Duration::from_millis(50);

/// A connection's place under its listener's cap: held by the connection's task, and by
/// a WebSocket tunnel the connection became, until the last of them ends. The proxy
/// finds it in the extensions of requests that ask for an upgrade.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionSlot(Arc<Slot>);

#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    _open: GaugeGuard,
    /// The names of the client certificate the TLS handshake verified, if one did.
    client: std::sync::OnceLock<Arc<ClientNames>>,
}

impl ConnectionSlot {
    /// The names of the connection's verified client certificate, if it presented one.
    pub(crate) fn client_names(&self) -> Option<&ClientNames> {
        self.0.client.get().map(|n| &**n)
    }

    /// Notes the verified client certificate's names, once the handshake is done.
    pub(crate) fn set_client_names(&self, names: ClientNames) {
        let _ = self.0.client.set(Arc::new(names));
    }
}

/// A bound listener with its cap and client timeout.
pub(crate) struct Listener {
    tcp: TcpListener,
    kind: ListenerKind,
    slots: Arc<Semaphore>,
    max: usize,
    header_read_timeout: Option<Duration>,
    builders: Arc<Builders>,
    tls: Option<Tls>,
    metrics: Arc<Metrics>,
    /// Where idle connections are found to close for room at the cap, if it does.
    reclaim: Option<Arc<Reclaim>>,
}

impl Listener {
    /// Serves `tcp` as the `kind` listener, with at most `max` connections open (at
    /// least 1), `header_read_timeout` for each request's head and the default HTTP/2
    /// limits.
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
            builders: Arc::new(Builders::new(header_read_timeout, &Http2Limits::default())),
            tls: None,
            metrics,
            reclaim: None,
        }
    }

    /// Closing the longest-idle connection to admit a new one at the cap, rather than
    /// holding the new one until a connection closes (see the module's docs).
    pub(crate) fn reclaim_idle(mut self) -> Listener {
        self.reclaim = Some(Arc::default());
        self
    }

    /// With `limits` on its HTTP/2 connections.
    pub(crate) fn http2_limits(mut self, limits: &Http2Limits) -> Listener {
        self.builders = Arc::new(Builders::new(self.header_read_timeout, limits));
        self
    }

    /// Terminating TLS with `tls`, if given.
    pub(crate) fn tls(mut self, tls: Option<Tls>) -> Listener {
        self.tls = tls;
        self
    }

    /// Its TLS, if it terminates TLS.
    pub(crate) fn tls_config(&self) -> Option<&Tls> {
        self.tls.as_ref()
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
        S::Error: Into<BoxError> + Send + 'static,
        B: http_body::Body + Unpin + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let connections = Connections::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut pause = ACCEPT_PAUSE_MIN;
        loop {
            let (permit, stream, peer) = tokio::select! {
                () = &mut shutdown => break,
                admitted = self.admit(&mut pause) => admitted,
            };
            let slot = ConnectionSlot(Arc::new(Slot {
                _permit: permit,
                _open: self.metrics.connection_guard(self.kind),
                client: std::sync::OnceLock::new(),
            }));
            Handler {
                stream,
                service: service_for(peer, &slot),
                timeout: self.header_read_timeout,
                builders: self.builders.clone(),
                tls: self.tls.clone(),
                slot,
                shutdown: connections.shutdown(),
                reclaim: self.reclaim.clone(),
            }
            .spawn();
        }
        connections
    }

    /// The next connection and its place under the cap. Without reclaiming, the place
    /// comes first: at the cap, nothing is accepted until a connection closes.
    async fn admit(&self, pause: &mut Duration) -> (OwnedSemaphorePermit, TcpStream, SocketAddr) {
        let Some(reclaim) = &self.reclaim else {
            let permit = self.place().await;
            let (stream, peer) = self.accept(pause).await;
            return (permit, stream, peer);
        };
        // Reclaiming: at the cap, an arrival is accepted (one descriptor beyond the
        // cap, for a moment) and makes room by closing the longest-idle connection. A
        // free place is looked at first, so nobody is closed for room that was there.
        let (stream, peer) = tokio::select! {
            biased;
            permit = self.place() => {
                let (stream, peer) = self.accept(pause).await;
                return (permit, stream, peer);
            }
            accepted = self.accept(pause) => accepted,
        };
        loop {
            if reclaim.close_longest_idle() {
                tracing::debug!(
                    listener = self.kind.as_str(),
                    max = self.max,
                    "at the connection cap; closing the longest-idle connection for a new one"
                );
            }
            let place = self.slots.clone().acquire_owned();
            if let Ok(permit) = tokio::time::timeout(RECLAIM_RECHECK, place).await {
                return (permit.expect("the semaphore is never closed"), stream, peer);
            }
        }
    }

    /// A place under the cap, once one is free.
    async fn place(&self) -> OwnedSemaphorePermit {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return permit;
        }
        self.metrics.count_connection_wait(self.kind);
        tracing::debug!(
            listener = self.kind.as_str(),
            max = self.max,
            "at the connection cap; accepting again once a connection closes"
        );
        self.slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// The next connection. An `accept` that fails (out of file descriptors and the
    /// like) is followed by a pause, `pause` long and doubled each time in a row, while
    /// what is open goes on being served.
    async fn accept(&self, pause: &mut Duration) -> (TcpStream, SocketAddr) {
        loop {
            match self.tcp.accept().await {
                Ok(accepted) => {
                    *pause = ACCEPT_PAUSE_MIN;
                    return accepted;
                }
                Err(e) => {
                    self.metrics.count_accept_error(self.kind);
                    tracing::warn!(
                        listener = self.kind.as_str(),
                        error = %e,
                        pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                        "accept failed"
                    );
                    tokio::time::sleep(*pause).await;
                    *pause = (*pause * 2).min(ACCEPT_PAUSE_MAX);
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// At its cap, a listener that reclaims idle places admits a newcomer by closing
    /// its idle connection, never the older one whose request is still in progress.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_the_cap_the_idle_connection_makes_room_and_a_busy_one_never_does() {
        use http_body_util::Full;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        const BOUND: Duration = Duration::from_secs(10);
        let tcp = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = tcp.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        // A client timeout far beyond the test: only reclaiming can make room.
        let listener = Listener::new(
            tcp,
            ListenerKind::Admin,
            2,
            Some(Duration::from_secs(600)),
            metrics,
        )
        .reclaim_idle();
        let release = Arc::new(Semaphore::new(0));
        let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (release_, entered_tx_) = (release.clone(), entered_tx.clone());
        let server = tokio::spawn(async move {
            let service_for = move |_, _: &ConnectionSlot| {
                let (release, entered) = (release_.clone(), entered_tx_.clone());
                hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (release, entered) = (release.clone(), entered.clone());
                    async move {
                        if req.uri().path() == "/slow" {
                            let _ = entered.send(());
                            let _permit = release.acquire().await;
                        }
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                            bytes::Bytes::from_static(b"ok"),
                        )))
                    }
                })
            };
            let connections = listener
                .run(service_for, async {
                    let _ = stopped.await;
                })
                .await;
            connections
                .finish(tokio::time::Instant::now() + BOUND)
                .await;
        });
        drop(entered_tx);

        async fn get(stream: &mut TcpStream, path: &str) {
            let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
        }
        async fn answer(stream: &mut TcpStream) -> String {
            let mut buf = vec![0; 1024];
            let n = tokio::time::timeout(BOUND, stream.read(&mut buf))
                .await
                .expect("an answer within the bound")
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        }

        // The older connection has a request in progress.
        let mut busy = TcpStream::connect(addr).await.unwrap();
        get(&mut busy, "/slow").await;
        tokio::time::timeout(BOUND, entered.recv())
            .await
            .expect("the slow request reaches the service");
        // The younger one was answered and is idle, kept alive.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        get(&mut idle, "/fast").await;
        assert!(answer(&mut idle).await.starts_with("HTTP/1.1 200"));

        // Both places are taken: the newcomer is admitted in the idle one's place.
        let mut newcomer = TcpStream::connect(addr).await.unwrap();
        get(&mut newcomer, "/fast").await;
        assert!(answer(&mut newcomer).await.starts_with("HTTP/1.1 200"));
        assert_eq!(
            answer(&mut idle).await,
            "",
            "the idle connection was closed"
        );

        // The busy one was never closed: its answer comes once the service gives it.
        release.add_permits(1);
        assert!(answer(&mut busy).await.starts_with("HTTP/1.1 200"));

        let _ = stop.send(());
        tokio::time::timeout(BOUND, server)
            .await
            .expect("the listener stops")
            .unwrap();
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
}
