//! One connection, served by hyper in a task of its own until it ends or shutdown asks
//! it to finish: TCP keepalive and no Nagle delay on the socket, the client timeout on
//! each request's head and on writes that make no progress, upgrades for WebSocket
//! tunnels, and the connection's place under the cap held until it ends.

use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tower::BoxError;

use super::shutdown::Shutdown;
use super::write_stall::WriteStall;
use super::{ConnectionSlot, KEEPALIVE_IDLE};

/// A connection about to be served.
pub(super) struct Handler<S> {
    pub(super) stream: TcpStream,
    pub(super) service: S,
    /// The client timeout: for each request's head, and for writes without progress.
    pub(super) timeout: Option<Duration>,
    pub(super) slot: ConnectionSlot,
    pub(super) shutdown: Shutdown,
}

impl<S, B> Handler<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
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
            slot,
            mut shutdown,
        } = self;
        let _ = stream.set_nodelay(true);
        if let Err(e) = keep_alive(&stream) {
            tracing::debug!(error = %e, "TCP keepalive could not be set on a connection");
        }
        // A client that sends no complete request head in time (a slow or stalled one,
        // or an idle keep-alive connection) is disconnected, so it cannot hold a
        // connection and its buffers without limit. With upgrades, so that the proxy can
        // hand a switched connection (a WebSocket) over to its tunnel.
        let stream = WriteStall::new(stream, timeout);
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(timeout)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut conn = std::pin::pin!(conn);
        let ended = tokio::select! {
            biased;
            ended = conn.as_mut() => ended,
            () = shutdown.recv() => {
                // Finish the request in progress, if any, then close.
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = ended {
            tracing::debug!(error = %e, "connection ended with an error");
        }
        // The place under the cap goes first, then the shutdown's hold: once `finish`
        // sees every connection closed, none holds a place any more.
        drop(slot);
        drop(shutdown);
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
