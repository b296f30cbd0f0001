//! [`Execution`]: a keyed request's execution, run inside its response future, that
//! survives that future being dropped (SPEC S7).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use http::Response;
use tokio::runtime::Handle;

use crate::IdempotencyBody;
use crate::problem::{Problem, ProblemKind};
use crate::profile::Dialect;

type BoxFuture<B> = Pin<Box<dyn Future<Output = Response<IdempotencyBody<B>>> + Send + 'static>>;

/// Polls an execution in place, so the common path spawns no task; if dropped before the
/// execution finished (the client went away), hands what is left of it to the runtime,
/// where it runs to completion and records its answer.
pub(crate) struct Execution<B: 'static> {
    future: Option<BoxFuture<B>>,
    /// The runtime that was polling the execution when it started, for a detached
    /// remainder: a drop may happen on a thread outside any runtime.
    runtime: Option<Handle>,
    /// Set while the execution is a duplicate waiting between two reserves (SPEC S15),
    /// holding nothing: dropped then, it is dropped, not finished.
    parked: Arc<AtomicBool>,
    /// The dialect of the 500 for an execution that panics.
    dialect: Dialect,
}

impl<B: 'static> Execution<B> {
    /// Wraps `future`; call from inside the runtime that is to finish it if need be.
    /// `parked` is set by the future while it may be dropped without finishing.
    pub(crate) fn new<F>(future: F, parked: Arc<AtomicBool>, dialect: Dialect) -> Execution<B>
    where
        F: Future<Output = Response<IdempotencyBody<B>>> + Send + 'static,
    {
        Execution {
            future: Some(Box::pin(future)),
            runtime: Handle::try_current().ok(),
            parked,
            dialect,
        }
    }
}

impl<B: 'static> Future for Execution<B> {
    type Output = Response<IdempotencyBody<B>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let future = self
            .future
            .as_mut()
            .expect("Execution polled after it finished");
        // Handler panics are caught closer to the handler and recorded; one that gets
        // here is the layer's or the store's, and the execution cannot go on. Its record
        // stays in progress until its lease lapses, and the client gets a 500.
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx)));
        let response = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(response)) => response,
            Err(panic) => {
                tracing::error!(
                    panic = panic_message(&*panic),
                    "a keyed request's execution panicked; answering 500"
                );
                Problem::new(
                    ProblemKind::HandlerFailed,
                    "the request's execution ended without an answer",
                )
                .answer(self.dialect)
                .map(IdempotencyBody::buffered)
            }
        };
        self.future = None;
        Poll::Ready(response)
    }
}

impl<B: 'static> Drop for Execution<B> {
    fn drop(&mut self) {
        let Some(rest) = self.future.take() else {
            return;
        };
        if self.parked.load(Ordering::Acquire) {
            // A waiting duplicate whose client went away: nothing reserved, nothing
            // to record; its waiter slot and watch go with it.
            return;
        }
        match &self.runtime {
            Some(runtime) => {
                // Whatever it answers, nobody is waiting for it; the store is.
                runtime.spawn(async move {
                    rest.await;
                });
            }
            None => tracing::error!(
                "a keyed request's execution was dropped outside a tokio runtime before it \
                 finished; its record stays in progress until its lease lapses"
            ),
        }
    }
}

/// What a caught panic said, for the log.
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}
