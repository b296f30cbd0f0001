//! What can end an operation without an answer to act on. Every message says what to
//! do next.

use std::fmt;

use http::StatusCode;
use idem_core::Key;

use crate::Outcome;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an operation has no usable answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// 422: the server holds a record for this key made by a request with a different
    /// payload (SPEC S5). Never retried.
    #[error(
        "the server says Idempotency-Key {key} was already used for a different request \
         ({detail}); a different payload is a different operation: create a new operation \
         (it gets a new key), or send the original payload unchanged"
    )]
    KeyReused {
        /// The key.
        key: Key,
        /// The server's explanation.
        detail: String,
        /// The server's answer.
        answer: Box<Outcome>,
    },

    /// 410 `key-expired`: the operation with this key completed once, its recorded
    /// answer has expired, and the server's tombstone refuses to execute it again (SPEC
    /// S16). Never retried. The answer's body says when it completed and with what
    /// status (`completed_at`, `completed_status`).
    #[error(
        "the server says the operation with Idempotency-Key {key} already completed and \
         its answer has expired ({detail}); it was not executed again: look up its result \
         in your records, and create a new operation only for a new intent"
    )]
    KeyExpired {
        /// The key.
        key: Key,
        /// The server's explanation.
        detail: String,
        /// The server's answer.
        answer: Box<Outcome>,
    },

    /// 400 about the key: malformed, repeated or missing (SPEC S2). Never retried.
    #[error(
        "the server rejected Idempotency-Key {key} ({detail}); send one header of 1 to 255 \
         printable ASCII characters, such as a UUID from random_key()"
    )]
    InvalidKey {
        /// The key.
        key: Key,
        /// The server's explanation.
        detail: String,
        /// The server's answer.
        answer: Box<Outcome>,
    },

    /// Another 400 or 422: the request itself was refused before it executed. Never
    /// retried.
    #[error(
        "the server refused the request with {status} ({detail}); it was not executed: fix \
         the request and send it as a new operation"
    )]
    Rejected {
        /// The key.
        key: Key,
        /// 400 or 422.
        status: StatusCode,
        /// The server's explanation (the problem `detail`, else the start of the body).
        detail: String,
        /// The server's answer.
        answer: Box<Outcome>,
    },

    /// Retries stopped before an answer came. The server may or may not have executed:
    /// the outcome is unknown until the same operation (the same key) is sent again.
    #[error(
        "gave up on the operation with Idempotency-Key {key} after {attempts} attempt(s) \
         ({reason}); last: {last}; its outcome is unknown: send the same operation again \
         later, with the same key, to learn it"
    )]
    Exhausted {
        /// The key, to keep for the later retry.
        key: Key,
        /// Attempts made.
        attempts: u32,
        /// Which limit stopped the retries.
        reason: GiveUp,
        /// The last attempt's failure.
        last: Box<Failure>,
    },

    /// The request could not be sent and sending it again would fail the same way (an
    /// invalid request, a redirect loop).
    #[error("the operation with Idempotency-Key {key} cannot be sent: {source}")]
    Transport {
        /// The key.
        key: Key,
        /// Attempts made.
        attempts: u32,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },

    /// The operation was built wrong (a bad URL or header); nothing was sent.
    #[error("the operation is malformed: {0}")]
    Build(String),

    /// An `https://` URL without TLS support compiled in.
    #[error("{0} is an https:// URL: enable the `rustls` feature of idem-client to send it")]
    TlsDisabled(String),

    /// The journal's database failed.
    #[cfg(feature = "journal")]
    #[error("the operation journal failed: {0}")]
    Journal(#[from] sqlx::Error),

    /// The journal holds a different request under this operation's key.
    #[cfg(feature = "journal")]
    #[error(
        "the journal already holds a different request under Idempotency-Key {key}; \
         give this operation its own key"
    )]
    JournalConflict {
        /// The key.
        key: Key,
    },

    /// The journal holds a different request under this business id
    /// ([`Journal::persist_unique`](crate::Journal::persist_unique)).
    #[cfg(feature = "journal")]
    #[error(
        "the journal already holds a different request (method, URL, headers or body) under \
         this business id, as the operation with Idempotency-Key {key}; a business id is \
         sent once: send that request unchanged, or give a new operation its own business id"
    )]
    BusinessIdConflict {
        /// The key of the operation journaled under the business id.
        key: Key,
    },

    /// The operation carries a credential header; the journal never writes credentials
    /// to disk.
    #[cfg(feature = "journal")]
    #[error(
        "the operation carries a `{header}` header, and the journal never stores \
         credentials: set it in the reqwest client's default headers (ClientBuilder::http) \
         so resumed operations get it from the running process"
    )]
    CredentialInJournal {
        /// The header's name.
        header: String,
    },
}

impl Error {
    /// The operation's key, when the error belongs to a sent operation.
    pub fn key(&self) -> Option<&Key> {
        match self {
            Error::KeyReused { key, .. }
            | Error::KeyExpired { key, .. }
            | Error::InvalidKey { key, .. }
            | Error::Rejected { key, .. }
            | Error::Exhausted { key, .. }
            | Error::Transport { key, .. } => Some(key),
            #[cfg(feature = "journal")]
            Error::JournalConflict { key } | Error::BusinessIdConflict { key } => Some(key),
            _ => None,
        }
    }

    /// Attempts made before the error, zero when nothing was sent.
    pub fn attempts(&self) -> u32 {
        match self {
            Error::KeyReused { answer, .. }
            | Error::KeyExpired { answer, .. }
            | Error::InvalidKey { answer, .. }
            | Error::Rejected { answer, .. } => answer.attempts,
            Error::Exhausted { attempts, .. } | Error::Transport { attempts, .. } => *attempts,
            _ => 0,
        }
    }

    /// Whether sending the same operation again later may succeed: only after
    /// [`Error::Exhausted`], whose outcome is unknown. The others would fail again.
    pub fn is_retryable_later(&self) -> bool {
        matches!(self, Error::Exhausted { .. })
    }
}

/// Which limit stopped the retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUp {
    /// The policy's maximum number of attempts was reached.
    MaxAttempts,
    /// The next wait would have ended past the overall deadline.
    Deadline,
    /// The client's retry budget had no retry left (the server is failing a large share
    /// of requests; retrying harder would only add load).
    Budget,
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GiveUp::MaxAttempts => "the maximum number of attempts was reached",
            GiveUp::Deadline => "the deadline would pass before the next attempt",
            GiveUp::Budget => "the client's retry budget is spent",
        })
    }
}

/// How the last attempt failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure {
    /// A retryable answer (409, 429, 502, 503, 504, or what a custom classifier chose).
    Answer(Outcome),
    /// No answer: connection refused, reset or closed, a timeout.
    Transport(reqwest::Error),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Answer(o) => write!(f, "answer {}", o.status),
            Failure::Transport(e) => {
                write!(f, "no answer: {e}")?;
                let mut source = std::error::Error::source(e);
                while let Some(s) = source {
                    write!(f, ": {s}")?;
                    source = s.source();
                }
                Ok(())
            }
        }
    }
}
