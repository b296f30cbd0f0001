//! What a connection has in hand: the requests (HTTP/2 streams) it is answering, so
//! that a connection with none for the client timeout is closed. HTTP/1.1 has hyper's
//! header-read timeout for that; HTTP/2 has nothing of its own, and a client that
//! opened a connection (or only sent the preface) and then no stream would hold it,
//! and its place under the cap, for ever.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::sync::watch;

/// Requests open on one connection, and how many have started in all.
#[derive(Debug, Clone, Copy, Default)]
struct Count {
    open: usize,
    started: u64,
}

/// One connection's count of open requests.
#[derive(Debug, Clone)]
pub(super) struct Activity(watch::Sender<Count>);

impl Activity {
    pub(super) fn new() -> Activity {
        Activity(watch::Sender::new(Count::default()))
    }

    /// One more request open, until the guard is dropped.
    fn start(&self) -> Open {
        self.0.send_modify(|c| {
            c.open += 1;
            c.started += 1;
        });
        Open(self.0.clone())
    }

    /// Resolves once the connection has had no request open for `timeout`.
    pub(super) async fn idle_for(&self, timeout: Duration) {
        let mut rx = self.0.subscribe();
        loop {
            let started = rx.wait_for(|c| c.open == 0).await.map(|c| c.started);
            // An error means the sender is gone; `self` holds it.
            let Ok(started) = started else {
                return std::future::pending().await;
            };
            let busy = async {
                let _ = rx.wait_for(|c| c.open > 0 || c.started != started).await;
            };
            if tokio::time::timeout(timeout, busy).await.is_err() {
                return;
            }
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
struct Open(watch::Sender<Count>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.send_modify(|c| c.open -= 1);
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
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let open = self.activity.start();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let res = answer.await?;
            Ok(res.map(|inner| TrackedBody { inner, _open: open }))
        })
    }
}

/// An answer's body, whose request is counted open until it is dropped.
#[derive(Debug)]
pub(super) struct TrackedBody<B> {
    inner: B,
    _open: Open,
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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
