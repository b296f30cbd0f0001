//! What a connection has in hand: the requests (HTTP/2 streams) it is answering, so
//! that a connection with none for the client timeout is closed. HTTP/1.1 has hyper's
//! header-read timeout for that; HTTP/2 has nothing of its own, and a client that
//! opened a connection (or only sent the preface) and then no stream would hold it,
//! and its place under the cap, for ever.
//!
//! And which of its HTTP/2 streams wait on their client's window (see [`super::window`]):
//! once a stream is reset for waiting so the client timeout while every other stream
//! open on the connection waits so too, the connection is closed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use bytes::Buf;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::sync::watch;
use tokio::time::Instant;

use super::window::Watch;

/// Requests open on one connection, since when none has been, and how many of the open
/// ones wait on the client's window.
#[derive(Debug, Clone, Copy)]
struct Count {
    open: usize,
    /// When the last request open ended (or the connection began).
    idle_since: Instant,
    /// Open HTTP/2 streams whose answer waits for room in the client's window.
    waiting: usize,
    /// A stream was reset for waiting the client timeout while every other stream
    /// open waited on the client too.
    abandoned: bool,
}

/// One connection's count of open requests.
///
/// Opening and ending a request wakes nobody: HTTP/1.1 does both on every request, and
/// a wake-up there costs a poll of the whole connection. The idle timer reads the count
/// when it fires instead; only `abandoned`, which is rare, is told at once.
#[derive(Debug, Clone)]
pub(super) struct Activity(watch::Sender<Count>);

impl Activity {
    pub(super) fn new() -> Activity {
        Activity(watch::Sender::new(Count {
            open: 0,
            idle_since: Instant::now(),
            waiting: 0,
            abandoned: false,
        }))
    }

    /// One more request open, until the guard is dropped.
    pub(super) fn start(&self) -> Open {
        self.0.send_if_modified(|c| {
            c.open += 1;
            false
        });
        Open(self.0.clone())
    }

    /// Since when the connection has had no request open; `None` while one is.
    pub(super) fn idle_since(&self) -> Option<tokio::time::Instant> {
        let count = self.0.borrow();
        (count.open == 0).then_some(count.idle_since)
    }

    /// Resolves once the connection has had no request open for `timeout`, counted
    /// from the call at the earliest: the timer fires when that would be so, and while
    /// requests are open, every `timeout`.
    pub(super) async fn idle_for(&self, timeout: Duration) {
        let called = Instant::now();
        let idle_until = |count: &Count| count.idle_since.max(called) + timeout;
        let mut deadline = idle_until(&self.0.borrow());
        loop {
            tokio::time::sleep_until(deadline).await;
            let now = Instant::now();
            let count = *self.0.borrow();
            if count.open > 0 {
                deadline = now + timeout;
            } else if idle_until(&count) <= now {
                return;
            } else {
                deadline = idle_until(&count);
            }
        }
    }

    /// Resolves once a stream was reset for waiting on its client's window for the
    /// client timeout while every other stream open on the connection waited so too:
    /// the client reads nothing the connection sends.
    pub(super) async fn abandoned(&self) {
        let mut rx = self.0.subscribe();
        if rx.wait_for(|c| c.abandoned).await.is_err() {
            // The sender is gone; `self` holds it.
            std::future::pending::<()>().await;
        }
    }

    /// `service`, counting each request open from its call until its answer's body
    /// has been sent (or dropped).
    pub(super) fn track<S>(&self, service: S) -> Tracked<S> {
        Tracked {
            inner: service,
            activity: self.clone(),
        }
    }
}

/// A request counted open; dropped when its answer is done.
#[derive(Debug)]
pub(super) struct Open(watch::Sender<Count>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.send_if_modified(|c| {
            c.open -= 1;
            if c.open == 0 {
                c.idle_since = Instant::now();
            }
            false
        });
    }
}

/// A service whose requests are counted open on their connection.
#[derive(Debug, Clone)]
pub(super) struct Tracked<S> {
    inner: S,
    activity: Activity,
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Buf,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let open = self.activity.start();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let res = answer.await?;
            // Polled in the stream's task, where an HTTP/2 stream has its watch.
            let watch = Watch::current();
            Ok(res.map(|inner| TrackedBody {
                inner,
                open,
                watch,
                waiting: false,
            }))
        })
    }
}

/// An answer's body, whose request is counted open until it is dropped; on an HTTP/2
/// stream with a client timeout, it tells the stream's watch and the connection's
/// count when it waits on the client's window.
#[derive(Debug)]
pub(super) struct TrackedBody<B> {
    inner: B,
    open: Open,
    watch: Option<Arc<Watch>>,
    /// A frame handed over waits for room in the client's window.
    waiting: bool,
}

impl<B> TrackedBody<B> {
    fn set_waiting(&mut self, waiting: bool) {
        if self.waiting == waiting {
            return;
        }
        self.waiting = waiting;
        // Nobody waits for this change alone: only a reset reads it.
        self.open.0.send_if_modified(|c| {
            if waiting {
                c.waiting += 1;
            } else {
                c.waiting -= 1;
            }
            false
        });
    }
}

impl<B: Body + Unpin> Body for TrackedBody<B>
where
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let Some(watch) = this.watch.clone() else {
            return Pin::new(&mut this.inner).poll_frame(cx);
        };
        // Asked for the next frame: the last one had room.
        watch.asked();
        this.set_waiting(false);
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && frame.data_ref().is_some_and(Buf::has_remaining)
        {
            watch.handed();
            this.set_waiting(true);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for TrackedBody<B> {
    fn drop(&mut self) {
        let cut = self.watch.as_ref().is_some_and(|w| w.was_cut());
        let waiting = self.waiting;
        // Before `open` counts this request closed; the abandoned connection's waiter
        // is told.
        self.open.0.send_if_modified(|c| {
            if waiting {
                c.waiting -= 1;
            }
            if cut && c.open - 1 == c.waiting && !c.abandoned {
                c.abandoned = true;
                return true;
            }
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_once_nothing_has_been_open_for_the_timeout() {
        let activity = Activity::new();
        let started = tokio::time::Instant::now();
        activity.idle_for(Duration::from_secs(30)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(30));

        // A request open holds it busy however long it takes; its end restarts the count.
        let open = activity.start();
        let idle = activity.idle_for(Duration::from_secs(30));
        let mut idle = std::pin::pin!(idle);
        assert!(
            tokio::time::timeout(Duration::from_secs(100), idle.as_mut())
                .await
                .is_err()
        );
        let ended = tokio::time::Instant::now();
        drop(open);
        idle.await;
        assert_eq!(ended.elapsed(), Duration::from_secs(30));

        // A request that opened and closed within the timeout restarts it too.
        let started = tokio::time::Instant::now();
        let idle = activity.idle_for(Duration::from_secs(30));
        let brief = async {
            tokio::time::sleep(Duration::from_secs(20)).await;
            drop(activity.start());
        };
        tokio::join!(idle, brief);
        assert_eq!(started.elapsed(), Duration::from_secs(50));
    }
}
