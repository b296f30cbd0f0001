//! The bound on a client that stops reading: a connection whose writes make no progress
//! for the client timeout fails them, so the client cannot hold its connection, its
//! place under the cap and the answer's buffers for ever by asking for an answer and
//! never reading it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
