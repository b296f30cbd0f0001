//! Reading away the rest of a request body after an early answer (a lingering close).
//!
//! An answer given before the request body is read (413 over the limit, 408 too slow,
//! 400 for a bad or missing key) leaves the client still sending. Dropping the body
//! makes an HTTP/1.1 server close the connection with the client's bytes unread, and a
//! TCP close with unread bytes is a reset: a client that writes its whole body before it
//! reads (Python's `http.client`, several SDKs) then fails on a write, or loses the
//! answer, instead of reading it. [`drain_body`] reads the rest away in the background,
//! within a bound, so the answer is read and the connection may even be reused.

use std::pin::pin;
use std::time::Duration;

use http::{HeaderMap, header};
use http_body::Body;
use http_body_util::BodyExt;

/// The most body bytes read away after an early answer: past them the body is dropped,
/// and the connection closed.
pub const DRAIN_LIMIT: usize = 4 * 1024 * 1024;

/// The longest time a body is read away after an early answer: past it the body is
/// dropped, and the connection closed.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Hands the unread rest of a request's `body` to a background task that reads and
/// discards it, up to [`DRAIN_LIMIT`] bytes within [`DRAIN_TIMEOUT`], then drops it.
///
/// Call it with the request's `headers` and its body whenever a request is answered
/// before its body was read, in place of dropping the body: the client that sends its
/// whole body before it reads gets the answer instead of a reset connection. The
/// answer itself is not held up: the server writes it while the body is read away.
///
/// The body is dropped at once, with nothing read, when nothing is left of it, when
/// the request asked for `Expect: 100-continue` (its client waits for the answer before
/// sending, and reading would ask it to send), or outside a Tokio runtime.
pub fn drain_body<B>(headers: &HeaderMap, body: B)
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if !expects_continue {
        drain_in_background(body);
    }
}

/// [`drain_body`] of a body that is already being read: its client is sending.
pub(crate) fn drain_in_background<B>(body: B)
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    if body.is_end_stream() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let drained = drain(body, DRAIN_LIMIT, DRAIN_TIMEOUT).await;
            tracing::debug!(?drained, "read away the body of an early answer");
        });
    }
}

/// How reading a body away ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drained {
    /// The body ended after this many bytes.
    Ended(usize),
    /// The body went on past the limit, or failed, and was dropped.
    Dropped(usize),
    /// The body did not end within the time allowed.
    TimedOut(usize),
}

/// Reads `body` and discards it, up to `limit` bytes within `timeout`.
pub(crate) async fn drain<B: Body>(body: B, limit: usize, timeout: Duration) -> Drained {
    let mut body = pin!(body);
    let mut read = 0usize;
    let reading = async {
        while let Some(frame) = body.as_mut().frame().await {
            let Ok(frame) = frame else {
                return Drained::Dropped(read);
            };
            if let Some(data) = frame.data_ref() {
                read = read.saturating_add(bytes::Buf::remaining(data));
                if read > limit {
                    return Drained::Dropped(read);
                }
            }
        }
        Drained::Ended(read)
    };
    match tokio::time::timeout(timeout, reading).await {
        Ok(drained) => drained,
        Err(_) => Drained::TimedOut(read),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures_util::StreamExt;
    use http_body::Frame;
    use http_body_util::StreamBody;

    fn chunks(n: usize, size: usize) -> impl Body<Data = Bytes, Error = std::io::Error> {
        let stream = futures_util::stream::iter(
            (0..n).map(move |_| Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![0; size])))),
        );
        StreamBody::new(stream)
    }

    #[tokio::test]
    async fn reads_a_body_to_its_end_within_the_limit() {
        let drained = drain(chunks(16, 1024), 64 * 1024, Duration::from_secs(5)).await;
        assert_eq!(drained, Drained::Ended(16 * 1024));
    }

    #[tokio::test]
    async fn stops_reading_past_the_limit() {
        let drained = drain(chunks(1_000_000, 1024), 8 * 1024, Duration::from_secs(5)).await;
        assert_eq!(drained, Drained::Dropped(9 * 1024));
    }

    #[tokio::test]
    async fn stops_at_a_body_that_fails() {
        let stream = futures_util::stream::iter([
            Ok(Frame::data(Bytes::from_static(b"abc"))),
            Err(std::io::Error::other("reset")),
        ]);
        let drained = drain(StreamBody::new(stream), 1024, Duration::from_secs(5)).await;
        assert_eq!(drained, Drained::Dropped(3));
    }

    #[tokio::test(start_paused = true)]
    async fn stops_waiting_for_a_body_that_stalls() {
        let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(Frame::data(
            Bytes::from_static(b"abc"),
        ))])
        .chain(futures_util::stream::pending());
        let drained = drain(StreamBody::new(stream), 1024, DRAIN_TIMEOUT).await;
        assert_eq!(drained, Drained::TimedOut(3));
    }

    #[tokio::test]
    async fn a_client_waiting_for_100_continue_is_not_asked_to_send() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        /// A body that notes whether it was read.
        struct Watched(Arc<AtomicBool>);
        impl Body for Watched {
            type Data = Bytes;
            type Error = std::io::Error;
            fn poll_frame(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
                self.0.store(true, Ordering::SeqCst);
                std::task::Poll::Ready(None)
            }
        }
        let read = |headers: HeaderMap| async move {
            let polled = Arc::new(AtomicBool::new(false));
            drain_body(&headers, Watched(polled.clone()));
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            polled.load(Ordering::SeqCst)
        };
        let mut expects = HeaderMap::new();
        expects.insert(
            header::EXPECT,
            http::HeaderValue::from_static("100-Continue"),
        );
        assert!(!read(expects).await);
        assert!(read(HeaderMap::new()).await, "read away without the header");
    }
}
