//! One connection, served by hyper in a task of its own until it ends or shutdown asks
//! it to finish: TCP keepalive and no Nagle delay on the socket, HTTP/1.1 or HTTP/2 as
//! the connection's first bytes say, the client timeout on each request's head, on a
//! connection with no request open and on writes that make no progress, upgrades for
//! WebSocket tunnels (HTTP/1.1), and the connection's place under the cap held until it
//! ends.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tower::BoxError;

use super::activity::Activity;
use super::http2::Builders;
use super::plain;
use super::reclaim::{Reclaim, Registration, asked_to_close};
use super::shutdown::Shutdown;
use super::tls::Tls;
use super::window::StreamExecutor;
use super::write_stall::WriteStall;
use super::{ConnectionSlot, KEEPALIVE_IDLE};

/// A connection about to be served.
pub(super) struct Handler<S> {
    pub(super) stream: TcpStream,
    pub(super) service: S,
    /// The client timeout: for each request's head, for a connection with no request
    /// open, and for writes without progress.
    pub(super) timeout: Option<Duration>,
    pub(super) builders: Arc<Builders>,
    /// TLS to terminate first, if the listener has it.
    pub(super) tls: Option<Tls>,
    pub(super) slot: ConnectionSlot,
    pub(super) shutdown: Shutdown,
    /// The listener's register, where it closes idle connections for room.
    pub(super) reclaim: Option<Arc<Reclaim>>,
}

impl<S, B> Handler<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// Serves the connection in a task of its own.
    pub(super) fn spawn(self) {
        tokio::spawn(self.run());
    }

    async fn run(self) {
        let Handler {
            stream,
            service,
            timeout,
            builders,
            tls,
            slot,
            mut shutdown,
            reclaim,
        } = self;
        // Idle from the start: a connection that sends nothing may be closed for room.
        let activity = Activity::new();
        let registration = reclaim.as_ref().map(|r| r.register(&activity));
        let registration = registration.as_ref();
        let _ = stream.set_nodelay(true);
        if let Err(e) = keep_alive(&stream) {
            tracing::debug!(error = %e, "TCP keepalive could not be set on a connection");
        }
        match tls {
            None => {
                let stream = WriteStall::new(stream, timeout);
                let ends = Ends {
                    timeout,
                    shutdown: &mut shutdown,
                    registration,
                };
                serve(stream, &builders.auto, service, activity, ends).await;
            }
            Some(tls) => {
                // Plain HTTP to this port gets a 400 saying so, not a TLS alert. The
                // wait for the first byte counts against the handshake's time.
                let started = tokio::time::Instant::now();
                let first = async {
                    match timeout {
                        Some(t) => tokio::time::timeout(t, plain::starts_plain(&stream))
                            .await
                            .ok()
                            .flatten(),
                        None => plain::starts_plain(&stream).await,
                    }
                };
                let first = tokio::select! {
                    first = first => first,
                    () = shutdown.recv() => return,
                    () = asked_to_close(registration) => return,
                };
                match first {
                    Some(false) => {}
                    Some(true) => {
                        tracing::debug!("plain HTTP on the TLS listener: answered 400");
                        plain::refuse(stream).await;
                        return;
                    }
                    None => return,
                }
                let timeout_left = timeout.map(|t| t.saturating_sub(started.elapsed()));
                let stream = WriteStall::new(stream, timeout);
                // The handshake has the client timeout too, and shutdown ends it.
                let handshake = tls.acceptor().accept(stream);
                let handshake = async {
                    match timeout_left {
                        Some(t) => tokio::time::timeout(t, handshake)
                            .await
                            .unwrap_or_else(|_| {
                                Err(std::io::Error::new(
                                    std::io::ErrorKind::TimedOut,
                                    "no TLS handshake within the client timeout",
                                ))
                            }),
                        None => handshake.await,
                    }
                };
                let stream = tokio::select! {
                    accepted = handshake => accepted,
                    () = shutdown.recv() => return,
                    () = asked_to_close(registration) => return,
                };
                match stream {
                    Ok(stream) => {
                        let tls = stream.get_ref().1;
                        if let Some(names) = tls
                            .peer_certificates()
                            .and_then(|chain| chain.first())
                            .and_then(|leaf| super::client_cert::names(leaf))
                        {
                            slot.set_client_names(names);
                        }
                        let builder = match stream.get_ref().1.alpn_protocol() {
                            Some(b"h2") => &builders.http2,
                            Some(b"http/1.1") => &builders.http1,
                            _ => &builders.auto,
                        };
                        let ends = Ends {
                            timeout,
                            shutdown: &mut shutdown,
                            registration,
                        };
                        serve(stream, builder, service, activity, ends).await;
                    }
                    Err(e) => tracing::debug!(error = %e, "TLS handshake failed"),
                }
            }
        }
        // The place under the cap goes first, then the shutdown's hold: once `finish`
        // sees every connection closed, none holds a place any more.
        drop(slot);
        drop(shutdown);
    }
}

/// What ends a connection besides its client: the client timeout, shutdown, and its
/// listener asking for its place.
struct Ends<'a> {
    timeout: Option<Duration>,
    shutdown: &'a mut Shutdown,
    registration: Option<&'a Registration>,
}

/// Serves `io` with `builder` until the connection ends. A client that sends no
/// complete HTTP/1.1 request head in time (a slow or stalled one, or an idle keep-alive
/// connection), keeps a connection with no request open for the timeout (an HTTP/2
/// connection without streams, one that never sent its preface), or keeps every HTTP/2
/// stream's window shut for it is disconnected, so it cannot hold a connection and its
/// buffers without limit. With upgrades, so that the
/// proxy can hand a switched HTTP/1.1 connection (a WebSocket) over to its tunnel.
/// A connection its listener asks to close for room is closed at once if it has no
/// request open (it was chosen for that), else once its requests are answered.
async fn serve<I, S, B>(
    io: I,
    builder: &auto::Builder<StreamExecutor>,
    service: S,
    activity: Activity,
    ends: Ends<'_>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let Ends {
        timeout,
        shutdown,
        registration,
    } = ends;
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), activity.track(service));
    let mut conn = std::pin::pin!(conn);
    let idle = async {
        match timeout {
            Some(timeout) => activity.idle_for(timeout).await,
            None => std::future::pending().await,
        }
    };
    let abandoned = activity.abandoned();
    // A graceful close of HTTP/2 waits for the client to answer a ping; one that never
    // does is given the timeout once more, then dropped.
    let grace = timeout.unwrap_or(Duration::MAX);
    let ended = tokio::select! {
        biased;
        ended = conn.as_mut() => ended,
        () = shutdown.recv() => {
            // Finish the requests in progress, if any, then close.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = asked_to_close(registration) => {
            if activity.idle_since().is_some() {
                tracing::debug!("closing the longest-idle connection to make room for a new one");
                Ok(())
            } else {
                // A request arrived since it was chosen: answer it, then close.
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
        () = idle => {
            tracing::debug!("closing a connection that had no request open for the client timeout");
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(grace, conn).await {
                Ok(ended) => ended,
                Err(_) => Ok(()),
            }
        }
        () = abandoned => {
            // Its other streams, all waiting on the client too, are reset within the
            // timeout; then the GOAWAY ends the connection.
            tracing::debug!(
                "closing an HTTP/2 connection whose every stream waited on the client's window for the client timeout"
            );
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(grace, conn).await {
                Ok(ended) => ended,
                Err(_) => Ok(()),
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Turns TCP keepalive on for `stream`, so that a peer that vanished without closing
/// (a client whose network dropped) is found out and its connection closed. An idle
/// HTTP connection has the client timeout for that; a WebSocket tunnel has nothing else.
pub(super) fn keep_alive(stream: &TcpStream) -> std::io::Result<()> {
    let params = socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    socket2::SockRef::from(stream).set_tcp_keepalive(&params)
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

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
}
