//! The bound on an HTTP/2 client that keeps a stream's flow-control window shut: the
//! HTTP/2 form of [`WriteStall`](super::write_stall::WriteStall). Such a client reads its
//! socket (so no write stalls) and answers pings (so keepalive holds), yet lets no byte
//! of an answer through, and would hold the stream, the answer's bytes and the upstream
//! connection behind it for ever.
//!
//! hyper serves each HTTP/2 stream in a task it spawns on the connection's executor,
//! and asks the answer's body for its next frame only once the last one had room in the
//! client's window. So the listener's executor, [`StreamExecutor`], runs each stream
//! under a [`Watch`] that its body (see `activity::TrackedBody`) keeps up to date: a
//! frame handed over starts the wait, a call for the next frame ends it. A wait that
//! lasts the client timeout drops the stream's task: h2 resets the stream (`CANCEL`),
//! and the body goes, with the upstream connection or the buffered answer it held.
//! Time the body itself takes (the upstream, the layer) is never counted.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

tokio::task_local! {
    /// The watch of the HTTP/2 stream whose task is being polled.
    static STREAM: Arc<Watch>;
}

/// What one HTTP/2 stream's answer waits for.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// Since when the frame the body last handed over has waited for room in the
    /// client's window; `None` while the body has not handed one over, or is asked for
    /// the next.
    waiting: Mutex<Option<Instant>>,
    /// Set when the wait outlasted the client timeout and the stream is being dropped.
    cut: AtomicBool,
}

impl Watch {
    /// The watch of the HTTP/2 stream whose task runs this: `None` outside one
    /// (HTTP/1.1, or a listener without a client timeout).
    pub(super) fn current() -> Option<Arc<Watch>> {
        STREAM.try_with(Arc::clone).ok()
    }

    /// The body handed over a frame: until it is asked for the next, the stream waits
    /// on its client.
    pub(super) fn handed(&self) {
        *self.lock() = Some(Instant::now());
    }

    /// The body is asked for its next frame: the last one had room.
    pub(super) fn asked(&self) {
        *self.lock() = None;
    }

    /// Whether the stream was dropped because its client kept the window shut.
    pub(super) fn was_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }

    fn waiting_since(&self) -> Option<Instant> {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The executor of a listener's HTTP/2 streams: each runs in a task of its own, and
/// with a client timeout, under a [`Watch`] that drops it once its answer has waited
/// that long for room in the client's window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamExecutor {
    timeout: Option<Duration>,
}

impl StreamExecutor {
    /// Streams whose answers may wait `timeout` for the client's window; `None` for
    /// no bound.
    pub(super) fn new(timeout: Option<Duration>) -> StreamExecutor {
        StreamExecutor { timeout }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        match self.timeout {
            None => drop(tokio::spawn(stream)),
            Some(timeout) => drop(tokio::spawn(Watched {
                stream: Some(Box::pin(stream)),
                watch: Arc::default(),
                timeout,
                deadline: None,
                armed_for: None,
            })),
        }
    }
}

/// A stream's task under its watch.
struct Watched<F> {
    /// `None` once cut.
    stream: Option<Pin<Box<F>>>,
    watch: Arc<Watch>,
    timeout: Duration,
    /// Made at the first wait; boxed, so that `Watched` stays `Unpin`.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The start of the wait `deadline` is set for.
    armed_for: Option<Instant>,
}

impl<F: Future<Output = ()>> Future for Watched<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let Some(stream) = this.stream.as_mut() else {
            return Poll::Ready(());
        };
        if STREAM
            .sync_scope(this.watch.clone(), || stream.as_mut().poll(cx))
            .is_ready()
        {
            return Poll::Ready(());
        }
        // Every change to the wait happens in the body, polled just now.
        let Some(since) = this.watch.waiting_since() else {
            this.armed_for = None;
            return Poll::Pending;
        };
        let at = since + this.timeout;
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if this.armed_for != Some(since) {
            deadline.as_mut().reset(at);
            this.armed_for = Some(since);
        }
        if deadline.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        tracing::debug!(
            "resetting an HTTP/2 stream whose client kept its window shut for the client timeout"
        );
        this.watch.cut.store(true, Ordering::Release);
        // h2 resets a stream whose handles are all dropped (RST_STREAM, CANCEL).
        this.stream = None;
        Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that hands its body's first frame over, then waits for room that
    /// never comes (or, with `feeds`, asks for a frame every 20 s).
    async fn stream(watch_out: Arc<Mutex<Option<Arc<Watch>>>>, feeds: bool) {
        let watch = Watch::current().expect("run under a watch");
        *watch_out.lock().unwrap() = Some(watch.clone());
        watch.handed();
        if feeds {
            loop {
                tokio::time::sleep(Duration::from_secs(20)).await;
                watch.asked();
                watch.handed();
            }
        }
        std::future::pending::<()>().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_waiting_on_its_client_for_the_timeout_is_dropped() {
        let seen = Arc::new(Mutex::new(None));
        let exec = StreamExecutor::new(Some(Duration::from_secs(30)));
        let started = Instant::now();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let s = seen.clone();
        hyper::rt::Executor::execute(&exec, async move {
            let _done = done_tx;
            stream(s, false).await;
        });
        // The task's future is dropped at the cut, and with it the sender.
        let _ = done_rx.await;
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert!(seen.lock().unwrap().as_ref().unwrap().was_cut());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_whose_client_makes_room_within_the_timeout_goes_on() {
        let seen = Arc::new(Mutex::new(None));
        let exec = StreamExecutor::new(Some(Duration::from_secs(30)));
        let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
        let s = seen.clone();
        hyper::rt::Executor::execute(&exec, async move {
            let _done = done_tx;
            stream(s, true).await;
        });
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert!(done_rx.try_recv().is_err(), "still running");
        assert!(!seen.lock().unwrap().as_ref().unwrap().was_cut());
    }

    #[tokio::test(start_paused = true)]
    async fn outside_a_watched_stream_there_is_no_watch() {
        assert!(Watch::current().is_none());
    }
}
