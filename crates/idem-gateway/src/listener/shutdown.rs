//! Shutdown, from both ends: the listener asks every connection it serves to finish at
//! once ([`Connections::finish`]), and each connection's task holds a [`Shutdown`] that
//! tells it when to, and whose drop tells the listener it has closed.

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The connections one listener serves, asked to finish together at shutdown.
pub(crate) struct Connections {
    stop: watch::Sender<bool>,
    // Each connection's `Shutdown` holds a sender; `open` ends when the last is dropped.
    open_tx: mpsc::Sender<()>,
    open: mpsc::Receiver<()>,
}

impl Connections {
    pub(super) fn new() -> Connections {
        let (stop, _) = watch::channel(false);
        let (open_tx, open) = mpsc::channel(1);
        Connections {
            stop,
            open_tx,
            open,
        }
    }

    /// The shutdown signal of one more connection, held until it closes.
    pub(super) fn shutdown(&self) -> Shutdown {
        Shutdown {
            stop: self.stop.subscribe(),
            _open: self.open_tx.clone(),
        }
    }

    /// Asks every connection to finish its request in progress and close, and waits
    /// until all have, or `deadline`; whether all had.
    pub(crate) async fn finish(self, deadline: Instant) -> bool {
        let Connections {
            stop,
            open_tx,
            mut open,
        } = self;
        stop.send_replace(true);
        drop(open_tx);
        tokio::time::timeout_at(deadline, open.recv()).await.is_ok()
    }
}

/// One connection's end of shutdown.
pub(super) struct Shutdown {
    stop: watch::Receiver<bool>,
    /// Held for its drop, which tells [`Connections::finish`] this connection closed.
    _open: mpsc::Sender<()>,
}

impl Shutdown {
    /// Resolves once the listener asks its connections to finish.
    pub(super) async fn recv(&mut self) {
        // An error means the listener's end is gone, which only `finish` does.
        let _ = self.stop.wait_for(|stop| *stop).await;
    }
}
