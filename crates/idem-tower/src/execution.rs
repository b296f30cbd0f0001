//! [`Execution`]: a keyed request's execution, run inside its response future, that
//! survives that future being dropped (SPEC S7).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Handle;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Polls an execution in place, so the common path spawns no task; if dropped before the
/// execution finished (the client went away), hands what is left of it to the runtime,
/// where it runs to completion and records its answer.
pub(crate) struct Execution<T: 'static> {
    future: Option<BoxFuture<T>>,
    /// The runtime that was polling the execution when it started, for a detached
    /// remainder: a drop may happen on a thread outside any runtime.
    runtime: Option<Handle>,
}

impl<T: 'static> Execution<T> {
    /// Wraps `future`; call from inside the runtime that is to finish it if need be.
    pub(crate) fn new<F>(future: F) -> Execution<T>
    where
        F: Future<Output = T> + Send + 'static,
    {
        Execution {
            future: Some(Box::pin(future)),
            runtime: Handle::try_current().ok(),
        }
    }
}

impl<T: 'static> Future for Execution<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let future = self
            .future
            .as_mut()
            .expect("Execution polled after it finished");
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<T: 'static> Drop for Execution<T> {
    fn drop(&mut self) {
        let Some(rest) = self.future.take() else {
            return;
        };
        match &self.runtime {
            Some(runtime) => {
                // Whatever it answers, nobody is waiting for it; the store is.
                runtime.spawn(DropOutput(rest));
            }
            None => tracing::error!(
                "a keyed request's execution was dropped outside a tokio runtime before it \
                 finished; its record stays in progress until its lease lapses"
            ),
        }
    }
}

/// A detached execution: its answer is recorded, and the value itself discarded.
struct DropOutput<T: 'static>(BoxFuture<T>);

impl<T: 'static> Future for DropOutput<T> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx).map(drop)
    }
}
