//! Where the operation under a key stands when the layer answers (the SPEC's protocol
//! policies), so that a client, or an agent, knows whether the same key, or a new one,
//! is the safe retry.
//!
//! Every answer of the layer to a keyed request carries it in the
//! [`IDEMPOTENCY_OPERATION_STATE`] header, whatever the profile: replays, recorded and
//! released answers, and the layer's own problems. A problem carries it in its body as
//! well, as the member `operation_state` of the profile's error object.

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::config::DEFAULT_RELEASE_STATUSES;
use crate::problem::ProblemKind;

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

    /// The state a problem of `kind` says by itself; where it depends on the key's
    /// record (a key reused with another payload, a takeover), the layer says it instead.
    pub fn of_problem(kind: ProblemKind) -> OperationState {
        match kind {
            // Refused before the key was reserved, or (a new key over its rate) reserved
            // and released before anything was forwarded.
            ProblemKind::InvalidKey
            | ProblemKind::MissingKey
            | ProblemKind::BodyUnreadable
            | ProblemKind::MissingTenant
            | ProblemKind::InvalidCredential
            | ProblemKind::CredentialUnavailable
            | ProblemKind::InvalidPath
            | ProblemKind::InvalidHost
            | ProblemKind::InvalidMethodOverride
            | ProblemKind::AmbiguousHeader
            | ProblemKind::DuplicateJsonMember
            | ProblemKind::UnreadableJson
            | ProblemKind::InvalidJsonRpc
            | ProblemKind::BodyTooLarge
            | ProblemKind::BodyTimeout
            | ProblemKind::TooManyInFlight
            | ProblemKind::KeyRateExceeded
            | ProblemKind::UpstreamUnreachable => OperationState::NotStarted,
            ProblemKind::RequestInProgress => OperationState::InProgress,
            // A tombstone: it completed once. The others are recorded in place of an
            // answer, or are a recorded answer that cannot be given now.
            ProblemKind::KeyExpired
            | ProblemKind::HandlerFailed
            | ProblemKind::ResponseTooLarge
            | ProblemKind::ReplayUnavailable
            | ProblemKind::UpstreamAnswerTooLarge => OperationState::Completed,
            // The record could not be read; or the request was sent and no answer came.
            // A reused key's record is read for its state where it can be. A reservation
            // confirmed late was not executed under, but its lease may have lapsed in
            // the meantime and another attempt taken the key over and acted.
            ProblemKind::StoreUnavailable
            | ProblemKind::ReservationLate
            | ProblemKind::UpstreamTimeout
            | ProblemKind::UpstreamConnectionLost
            | ProblemKind::KeyReused => OperationState::Unknown,
        }
    }

    /// The state after the upstream's answer with `status` released the key: not
    /// started only where the status is one SPEC S6 defines as "did not start" and no
    /// earlier attempt may have acted (`recovered` is false).
    pub fn of_released(status: StatusCode, recovered: bool) -> OperationState {
        if !recovered && DEFAULT_RELEASE_STATUSES.contains(&status.as_u16()) {
            OperationState::NotStarted
        } else {
            OperationState::Unknown
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
    fn problems_say_where_the_operation_stands() {
        use OperationState::*;
        let cases = [
            (ProblemKind::InvalidKey, NotStarted),
            (ProblemKind::MissingKey, NotStarted),
            (ProblemKind::KeyRateExceeded, NotStarted),
            (ProblemKind::UpstreamUnreachable, NotStarted),
            (ProblemKind::RequestInProgress, InProgress),
            (ProblemKind::KeyExpired, Completed),
            (ProblemKind::HandlerFailed, Completed),
            (ProblemKind::UpstreamAnswerTooLarge, Completed),
            (ProblemKind::UpstreamTimeout, Unknown),
            (ProblemKind::UpstreamConnectionLost, Unknown),
            (ProblemKind::StoreUnavailable, Unknown),
        ];
        for (kind, state) in cases {
            assert_eq!(OperationState::of_problem(kind), state, "{kind:?}");
        }
    }

    #[test]
    fn a_released_answer_is_not_started_only_for_s6_statuses_on_a_first_attempt() {
        let of = |code: u16, recovered| {
            OperationState::of_released(StatusCode::from_u16(code).unwrap(), recovered)
        };
        assert_eq!(of(409, false), OperationState::NotStarted);
        assert_eq!(of(503, false), OperationState::NotStarted);
        assert_eq!(of(500, false), OperationState::Unknown);
        assert_eq!(of(502, false), OperationState::Unknown);
        assert_eq!(of(409, true), OperationState::Unknown);
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
}
