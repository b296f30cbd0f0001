//! Telling an upstream that does not speak HTTP/2 from one whose connection broke.
//!
//! With `--upstream-protocol http2`, a request to an HTTP/1.1-only upstream fails when
//! the upstream answers the client preface with HTTP/1.1 bytes (a `400`, or a close).
//! To the HTTP/2 client that is a broken connection after the request was sent, whose
//! outcome is unknown (504, the key kept until its lease lapses); yet such an upstream
//! never read the request as one, so nothing ran. RFC 9113 §3.4 has an HTTP/2 server
//! send a `SETTINGS` frame first: [`PrefaceCheck`] reads the first 9 bytes of each new
//! connection as a frame header, and where they are not a `SETTINGS` frame's on stream
//! 0 (or the upstream closes first) it fails the connection with [`NotHttp2`] and
//! marks it so in the connection's info, which the client's error carries: the proxy
//! answers such a request ([`never_spoke_http2`]) as unreachable, a 502 that
//! releases the key, so a retry executes. That the request was not sent is certain,
//! not a guess from the error: until the server preface is read, a connection writes
//! nothing past the client's own preface ([`Checked`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBuf, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use tower::Service;

/// The length of an HTTP/2 frame header (RFC 9113 §4.1).
const FRAME_HEADER: usize = 9;

/// The frame type of `SETTINGS` (RFC 9113 §6.5).
const SETTINGS: u8 = 0x4;

/// The upstream's first bytes were no HTTP/2 server preface: it does not speak HTTP/2,
/// and read no request of ours as one.
#[derive(Debug, thiserror::Error)]
#[error("the upstream does not speak HTTP/2: its first bytes are no SETTINGS frame")]
pub(crate) struct NotHttp2;

/// Set on a connection whose upstream sent no HTTP/2 server preface.
#[derive(Debug, Clone, Default)]
struct NoPreface(Arc<AtomicBool>);

/// Whether `err` happened on a connection whose upstream sent no HTTP/2 server
/// preface: it read no request as one.
pub(crate) fn never_spoke_http2(err: &hyper_util::client::legacy::Error) -> bool {
    let Some(info) = err.connect_info() else {
        return false;
    };
    let mut extras = http::Extensions::new();
    info.get_extras(&mut extras);
    extras
        .get::<NoPreface>()
        .is_some_and(|flag| flag.0.load(Ordering::Acquire))
}

/// A connector whose connections are checked for an HTTP/2 server preface.
#[derive(Debug, Clone)]
pub(crate) struct PrefaceCheck<C>(pub(crate) C);

impl<C> Service<Uri> for PrefaceCheck<C>
where
    C: Service<Uri>,
    C::Future: Send + 'static,
{
    type Response = Checked<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            Ok(Checked {
                io: connecting.await?,
                head: [0; FRAME_HEADER],
                seen: 0,
                handed: 0,
                verified: false,
                sent: [0; CLIENT_PREFIX],
                written: 0,
                failed: NoPreface::default(),
            })
        })
    }
}

/// The client's connection preface (RFC 9113 §3.4) before its `SETTINGS` frame.
const CLIENT_MAGIC: usize = 24;

/// The client's bytes up to the end of its `SETTINGS` frame's header.
const CLIENT_PREFIX: usize = CLIENT_MAGIC + FRAME_HEADER;

/// A new connection, held to HTTP/2's opening until the upstream proves it speaks it.
///
/// Until the upstream's first [`FRAME_HEADER`] bytes are read and are a `SETTINGS`
/// frame's, only the client's connection preface (the magic and its `SETTINGS` frame)
/// is written: every later byte, a request's `HEADERS` first of all, waits. So a
/// connection that fails before then (HTTP/1.1 bytes, a close, a reset, a write that
/// fails) carried no request, and is marked [`NoPreface`]: whatever the order in which
/// the client task meets the failure, nothing was sent. That costs a new connection
/// one round trip before its first request; a pooled one, nothing.
#[derive(Debug)]
pub(crate) struct Checked<T> {
    io: T,
    /// The upstream's first bytes, held until they are known to be a server preface.
    head: [u8; FRAME_HEADER],
    seen: usize,
    /// How much of `head` has been handed to the client.
    handed: usize,
    verified: bool,
    /// The client's first bytes, for the length of its `SETTINGS` frame.
    sent: [u8; CLIENT_PREFIX],
    written: usize,
    failed: NoPreface,
}

/// Whether a frame header is a `SETTINGS` frame's (not an ACK) on stream 0.
fn is_server_preface(head: &[u8; FRAME_HEADER]) -> bool {
    let length = u32::from_be_bytes([0, head[0], head[1], head[2]]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7FFF_FFFF;
    head[3] == SETTINGS && head[4] & 0x1 == 0 && stream == 0 && length.is_multiple_of(6)
}

impl<T> Checked<T> {
    /// `err`, after marking the connection as one that carried no request: it failed
    /// before the upstream's server preface, so no byte past the client's preface was
    /// written.
    fn no_preface(&self, err: std::io::Error) -> std::io::Error {
        self.failed.0.store(true, Ordering::Release);
        err
    }

    /// How many more bytes may be written before the upstream's preface is read: up
    /// to the end of the client's `SETTINGS` frame, whose length is known once its
    /// header is written.
    fn may_write(&self) -> usize {
        if self.written < CLIENT_PREFIX {
            return CLIENT_PREFIX - self.written;
        }
        let h = &self.sent[CLIENT_MAGIC..];
        let length = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        (CLIENT_PREFIX + length).saturating_sub(self.written)
    }
}

impl<T: Read + Unpin> Checked<T> {
    /// Reads the upstream's first frame header, and checks it.
    fn poll_preface(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.seen < FRAME_HEADER {
            let mut read = ReadBuf::new(&mut self.head[self.seen..]);
            match Pin::new(&mut self.io).poll_read(cx, read.unfilled()) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(self.no_preface(e))),
                Poll::Ready(Ok(())) => {}
            }
            let got = read.filled().len();
            if got == 0 {
                // A close before the header is whole: no preface either.
                let e = std::io::Error::new(std::io::ErrorKind::InvalidData, NotHttp2);
                return Poll::Ready(Err(self.no_preface(e)));
            }
            self.seen += got;
        }
        if !is_server_preface(&self.head) {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidData, NotHttp2);
            return Poll::Ready(Err(self.no_preface(e)));
        }
        self.verified = true;
        Poll::Ready(Ok(()))
    }
}

impl<T: Read + Unpin> Read for Checked<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.verified {
            std::task::ready!(this.poll_preface(cx))?;
        }
        if this.handed < FRAME_HEADER {
            let n = (FRAME_HEADER - this.handed).min(buf.remaining());
            buf.put_slice(&this.head[this.handed..this.handed + n]);
            this.handed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: Read + Write + Unpin> Write for Checked<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.verified {
            return Pin::new(&mut this.io).poll_write(cx, data);
        }
        let room = this.may_write();
        if room == 0 {
            // The client's preface is out: nothing more until the upstream's arrives.
            std::task::ready!(this.poll_preface(cx))?;
            return Pin::new(&mut this.io).poll_write(cx, data);
        }
        let data = &data[..data.len().min(room)];
        let n = match std::task::ready!(Pin::new(&mut this.io).poll_write(cx, data)) {
            Ok(n) => n,
            Err(e) => return Poll::Ready(Err(this.no_preface(e))),
        };
        if this.written < CLIENT_PREFIX {
            let k = n.min(CLIENT_PREFIX - this.written);
            this.sent[this.written..this.written + k].copy_from_slice(&data[..k]);
        }
        this.written += n;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match std::task::ready!(Pin::new(&mut this.io).poll_flush(cx)) {
            Err(e) if !this.verified => Poll::Ready(Err(this.no_preface(e))),
            done => Poll::Ready(done),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.verified {
            return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        }
        // Until the upstream's preface, one slice at a time, through the gate above.
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        Pin::new(this).poll_write(cx, first)
    }
}

impl<T: Connection> Connection for Checked<T> {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.failed.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The client's preface with a `SETTINGS` frame of one setting, then a request's
    /// first bytes, as one write.
    fn opening() -> Vec<u8> {
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend_from_slice(&[0, 0, 6, SETTINGS, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&[0, 3, 0, 0, 0, 100]);
        out.extend_from_slice(b"HEADERS-OF-A-REQUEST");
        out
    }

    fn checked(io: tokio::io::DuplexStream) -> Checked<TokioIo<tokio::io::DuplexStream>> {
        Checked {
            io: TokioIo::new(io),
            head: [0; FRAME_HEADER],
            seen: 0,
            handed: 0,
            verified: false,
            sent: [0; CLIENT_PREFIX],
            written: 0,
            failed: NoPreface::default(),
        }
    }

    /// Writes all of `data` through `c`, or fails.
    async fn write_all<T: Read + Write + Unpin>(
        c: &mut Checked<T>,
        mut data: &[u8],
    ) -> std::io::Result<()> {
        while !data.is_empty() {
            let n = std::future::poll_fn(|cx| Pin::new(&mut *c).poll_write(cx, data)).await?;
            data = &data[n..];
        }
        Ok(())
    }

    #[tokio::test]
    async fn nothing_past_the_client_preface_is_written_before_the_server_preface() {
        let (ours, mut upstream) = tokio::io::duplex(4096);
        let mut c = checked(ours);
        let failed = c.failed.clone();
        let opening = opening();
        {
            let writing = write_all(&mut c, &opening);
            let mut writing = std::pin::pin!(writing);
            // The preface goes out; the request's bytes wait.
            let mut got = vec![0u8; CLIENT_PREFIX + 6];
            tokio::select! {
                _ = writing.as_mut() => panic!("the request was written before the server preface"),
                r = upstream.read_exact(&mut got) => { r.unwrap(); }
            }
            assert_eq!(got, opening[..CLIENT_PREFIX + 6]);
            // The upstream answers in HTTP/1.1: the write fails, and nothing more was sent.
            upstream
                .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                .await
                .unwrap();
            let e = writing.await.unwrap_err();
            assert!(e.to_string().contains("does not speak HTTP/2"), "{e}");
            assert!(failed.0.load(Ordering::Acquire));
        }
        drop(c);
        let mut rest = Vec::new();
        upstream.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "sent after the preface: {rest:?}");
    }

    #[tokio::test]
    async fn after_a_server_preface_everything_flows_and_the_client_reads_it_whole() {
        let (ours, mut upstream) = tokio::io::duplex(4096);
        let mut c = checked(ours);
        let server = [0u8, 0, 0, SETTINGS, 0, 0, 0, 0, 0, b'n', b'e', b'x', b't'];
        upstream.write_all(&server).await.unwrap();
        let opening = opening();
        write_all(&mut c, &opening).await.unwrap();
        let mut got = vec![0u8; opening.len()];
        upstream.read_exact(&mut got).await.unwrap();
        assert_eq!(got, opening);
        assert!(!c.failed.0.load(Ordering::Acquire));
        let mut read = Vec::new();
        while read.len() < server.len() {
            let mut buf = [0u8; 64];
            let mut rb = ReadBuf::new(&mut buf);
            std::future::poll_fn(|cx| Pin::new(&mut c).poll_read(cx, rb.unfilled()))
                .await
                .unwrap();
            read.extend_from_slice(rb.filled());
        }
        assert_eq!(read, server);
    }

    #[tokio::test]
    async fn a_close_before_the_server_preface_marks_the_connection() {
        let (ours, upstream) = tokio::io::duplex(4096);
        let mut c = checked(ours);
        drop(upstream);
        let mut buf = [0u8; 16];
        let mut rb = ReadBuf::new(&mut buf);
        let e = std::future::poll_fn(|cx| Pin::new(&mut c).poll_read(cx, rb.unfilled()))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("does not speak HTTP/2"), "{e}");
        assert!(c.failed.0.load(Ordering::Acquire));
    }

    #[test]
    fn a_settings_frame_is_a_server_preface_and_http11_is_not() {
        assert!(is_server_preface(&[0, 0, 6, 4, 0, 0, 0, 0, 0]));
        assert!(is_server_preface(&[0, 0, 0, 4, 0, 0, 0, 0, 0]));
        assert!(!is_server_preface(&[0, 0, 0, 4, 1, 0, 0, 0, 0]), "an ACK");
        assert!(!is_server_preface(b"HTTP/1.1 "));
        assert!(!is_server_preface(&[0, 0, 8, 6, 0, 0, 0, 0, 0]), "a PING");
    }
}
