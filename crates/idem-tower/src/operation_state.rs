//! Where the operation under a key stands when the layer answers (the SPEC's protocol
//! policies), so that a client, or an agent, knows whether the same key, or a new one,
//! is the safe retry.
//!
//! Every answer of the layer to a keyed request carries it in the
//! [`IDEMPOTENCY_OPERATION_STATE`] header, whatever the profile: replays, recorded and
//! released answers, and the layer's own problems. A problem carries it in its body as
//! well, as the member `operation_state` of the profile's error object.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The header that says where the operation under the request's key stands.
pub const IDEMPOTENCY_OPERATION_STATE: HeaderName =
    HeaderName::from_static("idempotency-operation-state");

/// Where the operation under a key stands, as the layer knows it when it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationState {
    /// No attempt of this request started, and the key holds nothing of it: the layer
    /// refused it before reserving the key or forwarding it, or the upstream's answer
    /// released the key with a status that says the request did not start (SPEC S6's
    /// default list) on a first attempt. Fix the request if it was refused, and retry
    /// with the same key.
    NotStarted,
    /// An attempt with this key is executing (the 409): retry the same key later.
    InProgress,
    /// The operation concluded and its answer is recorded: every retry with the key gets
    /// that answer (a replay), and a new key would run the operation again.
    Completed,
    /// An attempt may have acted and its outcome is not recorded: the upstream timed out
    /// or the connection broke after the request was sent, an attempt took over a
    /// lapsed lease and was released, an answer released for a status other than S6's
    /// (a 5xx under `acp`), or the key's record could not be read. Retry with the same
    /// key; check your own records before you use a new one.
    Unknown,
}

impl OperationState {
    /// Every state, in the order the guide lists them.
    pub const ALL: [OperationState; 4] = [
        OperationState::NotStarted,
        OperationState::InProgress,
        OperationState::Completed,
        OperationState::Unknown,
    ];

    /// The name in headers and bodies: `not_started`, `in_progress`, `completed` or
    /// `unknown`.
    pub const fn as_str(self) -> &'static str {
        match self {
            OperationState::NotStarted => "not_started",
            OperationState::InProgress => "in_progress",
            OperationState::Completed => "completed",
            OperationState::Unknown => "unknown",
        }
    }

    /// The state of a key's record as the store holds it at `now`.
    pub(crate) fn of_record(
        state: &idem_core::RecordState,
        now: idem_core::Timestamp,
    ) -> OperationState {
        match state {
            idem_core::RecordState::InProgress { lease_until } if *lease_until > now => {
                OperationState::InProgress
            }
            idem_core::RecordState::InProgress { .. } => OperationState::Unknown,
            idem_core::RecordState::Completed { .. } | idem_core::RecordState::Tombstone { .. } => {
                OperationState::Completed
            }
        }
    }

    /// Sets the header on `headers`, in place of any the upstream sent.
    pub(crate) fn mark(self, headers: &mut HeaderMap) {
        headers.insert(
            IDEMPOTENCY_OPERATION_STATE,
            HeaderValue::from_static(self.as_str()),
        );
    }
}

impl std::fmt::Display for OperationState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_wire_names() {
        let names = OperationState::ALL.map(OperationState::as_str);
        assert_eq!(
            names,
            ["not_started", "in_progress", "completed", "unknown"]
        );
    }

    #[test]
    fn a_record_in_progress_is_unknown_once_its_lease_lapsed() {
        let at = idem_core::Timestamp::from_millis(1_000);
        let live = idem_core::RecordState::InProgress {
            lease_until: idem_core::Timestamp::from_millis(2_000),
        };
        assert_eq!(
            OperationState::of_record(&live, at),
            OperationState::InProgress
        );
        let later = idem_core::Timestamp::from_millis(3_000);
        assert_eq!(
            OperationState::of_record(&live, later),
            OperationState::Unknown
        );
        let gone = idem_core::RecordState::Tombstone {
            completed_at: at,
            status: 201,
        };
        assert_eq!(
            OperationState::of_record(&gone, at),
            OperationState::Completed
        );
    }

    #[test]
    fn a_released_answer_is_not_started_only_for_s6_statuses_on_a_first_attempt() {
        let of = |code: u16, recovered| {
            OperationState::of_released(http::StatusCode::from_u16(code).unwrap(), recovered)
        };
        assert_eq!(of(409, false), OperationState::NotStarted);
        assert_eq!(of(503, false), OperationState::NotStarted);
        assert_eq!(of(500, false), OperationState::Unknown);
        assert_eq!(of(502, false), OperationState::Unknown);
        assert_eq!(of(409, true), OperationState::Unknown);
    }
}
