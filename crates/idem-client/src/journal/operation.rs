//! What persisting gives back: a [`JournaledOperation`] to send, or, under a business id,
//! what became of the first operation ([`Persisted`]).

use idem_core::Key;

use super::{Entry, EntryState, Journal};
use crate::{Error, Operation, Outcome, Result};

/// What [`Journal::persist_unique`] found for a business id: the one way to send,
/// [`New`](Persisted::New), is the variant that holds an operation to send.
#[derive(Debug)]
#[must_use = "a new operation must be sent, and the others say what became of the id"]
pub enum Persisted {
    /// The first operation under this business id, now journaled as pending: send it.
    New(JournaledOperation),
    /// An operation under this id is journaled and has no answer yet (being sent, or
    /// left by retries that gave up or by a process that died). Not sent again;
    /// [`Journal::pending`] resumes it with this key.
    Pending {
        /// The pending operation's key.
        key: Key,
        /// Its entry.
        entry: Entry,
    },
    /// The operation under this id was answered.
    Completed {
        /// The answer as recorded: status, headers, body, the operation's key, and
        /// the attempts every process recorded.
        outcome: Outcome,
        /// Its entry.
        entry: Entry,
    },
    /// The operation under this id was refused in a way a resume would not change
    /// ([`EntryState::Failed`]).
    Failed {
        /// The refusal (a 400 or 422), if an answer came; `entry.last_error` says why.
        answer: Option<Outcome>,
        /// Its entry.
        entry: Entry,
    },
}

impl Persisted {
    /// The key of the operation journaled under the business id (`op`'s own when it is
    /// new).
    pub fn key(&self) -> &Key {
        match self {
            Persisted::New(op) => op.key(),
            Persisted::Pending { key, .. } => key,
            Persisted::Completed { entry, .. } | Persisted::Failed { entry, .. } => &entry.key,
        }
    }
}

/// An operation with its journal entry. [`send`](Self::send) sends it and records the
/// result.
#[derive(Debug, Clone)]
pub struct JournaledOperation {
    pub(super) id: i64,
    pub(super) op: Operation,
    pub(super) journal: Journal,
}

impl JournaledOperation {
    /// The journal's id for it.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The operation.
    pub fn operation(&self) -> &Operation {
        &self.op
    }

    /// The key.
    pub fn key(&self) -> &Key {
        self.op.key()
    }

    /// Sends the operation (see [`Operation::send`]) and records what came of it:
    /// an answer marks the entry completed; a refusal that a resume would not change
    /// (key reused, invalid request) marks it failed; retries that gave up leave it
    /// pending, for a later resume. Under a business id the answer's headers and body
    /// are recorded too, for [`Journal::persist_unique`] to give later operations.
    ///
    /// If recording fails the result is still returned and the entry stays pending; a
    /// later resume then gets the server's replay. The failure is logged.
    pub async fn send(&self) -> Result<Outcome> {
        let result = self.op.send().await;
        let recorded = match &result {
            Ok(outcome) => {
                self.journal
                    .record(
                        self.id,
                        EntryState::Completed,
                        outcome.attempts(),
                        Some(outcome),
                        None,
                    )
                    .await
            }
            Err(e) => {
                let state = if e.is_retryable_later() {
                    EntryState::Pending
                } else {
                    EntryState::Failed
                };
                let answer = match e {
                    Error::KeyReused { answer, .. }
                    | Error::InvalidKey { answer, .. }
                    | Error::Rejected { answer, .. } => Some(&**answer),
                    _ => None,
                };
                self.journal
                    .record(self.id, state, e.attempts(), answer, Some(e.to_string()))
                    .await
            }
        };
        if let Err(e) = recorded {
            tracing::warn!(id = self.id, key = %self.op.key(), error = %e,
                "could not record an operation's result in the journal; it stays pending");
        }
        result
    }
}
