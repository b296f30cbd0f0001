//! The decision table of SPEC S5, as one pure function. Stores and middleware both use
//! it; nothing else decides what an existing record means.

use std::time::Duration;

use crate::{Fingerprint, Lease, Record, RecordState, StoredResponse, Timestamp};

/// What to do with an incoming keyed request, given the record (if any) for its scope.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Decision {
    /// No live record, or a dead attempt's: execute as `attempt`. A store turns this into
    /// a [`Reservation::Acquired`] only through its atomic reserve.
    Execute {
        /// 1 for a fresh record, n+1 to take over an expired lease.
        attempt: u32,
    },
    /// A completed record with the same fingerprint: answer with it.
    Replay(StoredResponse),
    /// Another attempt holds a live lease: answer 409 with `Retry-After`.
    InProgress {
        /// How long to wait before asking again: see [`decide`].
        retry_after: Duration,
    },
    /// The key was used for a request with a different fingerprint: answer 422.
    Mismatch,
    /// The key's record expired and its tombstone remains (SPEC S16): answer 410 and do
    /// not execute again.
    Gone {
        /// When the operation's answer was recorded.
        completed_at: Timestamp,
        /// The status it was recorded with.
        status: u16,
    },
}

/// Decides SPEC S5's table:
///
/// | record                      | request            | decision                  |
/// |-----------------------------|--------------------|---------------------------|
/// | tombstone, alive (S16)      | fingerprint differs| `Mismatch`                |
/// | tombstone, alive (S16)      | same               | `Gone`                    |
/// | none, or expired            | any                | `Execute { attempt: 1 }`  |
/// | any state                   | fingerprint differs| `Mismatch`                |
/// | in progress, lease alive    | same               | `InProgress`              |
/// | in progress, lease expired  | same               | `Execute { attempt: n+1 }`|
/// | completed                   | same               | `Replay`                  |
///
/// A tombstone is alive while [`Record::tombstone`] says so: a
/// [`RecordState::Tombstone`] before its expiry, or a completed record past its expiry
/// but before its `tombstone_until` that no store has compacted yet.
///
/// The wait `InProgress` suggests is how long the record has existed, in whole
/// seconds rounded up, at least 1 and at most until the lease lapses. A duplicate that
/// comes soon after the first attempt began (a client that timed out early, a user who
/// pressed "send" again) is asked back soon, when the attempt has likely finished and
/// its answer can be replayed, rather than after the whole lease; the longer an attempt
/// runs, the longer the wait; and the wait never outlasts the lease, since an attempt
/// that died is taken over once its lease lapses.
pub fn decide(existing: Option<Record>, fingerprint: &Fingerprint, now: Timestamp) -> Decision {
    let Some(record) = existing else {
        return Decision::Execute { attempt: 1 };
    };
    if let Some((completed_at, status)) = record.tombstone(now) {
        return if record.fingerprint != *fingerprint {
            Decision::Mismatch
        } else {
            Decision::Gone {
                completed_at,
                status,
            }
        };
    }
    if record.is_expired(now) {
        return Decision::Execute { attempt: 1 };
    }
    if record.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    match record.state {
        RecordState::InProgress { lease_until } if lease_until > now => Decision::InProgress {
            retry_after: retry_after(now.since(record.created_at), lease_until.since(now)),
        },
        RecordState::InProgress { .. } => Decision::Execute {
            attempt: record.attempt.saturating_add(1),
        },
        RecordState::Completed { response, .. } => {
            Decision::Replay(crate::record::name_sealing_attempt(response, record.token))
        }
        // A tombstone that is not alive has expired, and was answered above.
        RecordState::Tombstone { .. } => Decision::Execute { attempt: 1 },
    }
}

/// `running`, but no longer than `remaining`, in whole seconds rounded up, and never
/// zero: `Retry-After: 0` invites a hot loop.
fn retry_after(running: Duration, remaining: Duration) -> Duration {
    let secs = |d: Duration| d.as_millis().div_ceil(1000).max(1) as u64;
    Duration::from_secs(secs(running).min(secs(remaining)))
}

/// The outcome of [`Store::reserve`](crate::Store::reserve).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Reservation {
    /// This caller won the reservation and must execute, then complete or release.
    Acquired(Lease),
    /// A completed record: replay it; do not execute.
    Replay(StoredResponse),
    /// Another attempt holds a live lease.
    InProgress {
        /// How long to wait before asking again (see [`decide`]): at least one second.
        retry_after: Duration,
    },
    /// The key was used with a different payload.
    Mismatch,
    /// The key's record expired and its tombstone remains (SPEC S16): the operation
    /// completed once and is not executed again; the answer is no longer kept.
    Gone {
        /// When the operation's answer was recorded.
        completed_at: Timestamp,
        /// The status it was recorded with.
        status: u16,
    },
}

impl Reservation {
    /// The reservation an existing record implies when this caller's atomic reserve did
    /// not take it, or `None` when [`decide`] says the record may now be taken (it
    /// expired or its lease lapsed between the store's write and its read): the store
    /// then tries its atomic reserve again.
    pub fn from_existing(
        existing: Record,
        fingerprint: &Fingerprint,
        now: Timestamp,
    ) -> Option<Reservation> {
        match decide(Some(existing), fingerprint, now) {
            Decision::Execute { .. } => None,
            Decision::Replay(r) => Some(Reservation::Replay(r)),
            Decision::InProgress { retry_after } => Some(Reservation::InProgress { retry_after }),
            Decision::Mismatch => Some(Reservation::Mismatch),
            Decision::Gone {
                completed_at,
                status,
            } => Some(Reservation::Gone {
                completed_at,
                status,
            }),
        }
    }

    /// The lease, when acquired.
    pub fn lease(&self) -> Option<&Lease> {
        match self {
            Reservation::Acquired(l) => Some(l),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, FencingToken, Key, Scope, ScopeMode, Tenant};

    fn fp(b: &[u8]) -> Fingerprint {
        Fingerprint::compute("POST", "POST /x", None, b, &Default::default())
    }

    fn record(state: RecordState, attempt: u32) -> Record {
        Record {
            scope: Scope::new(
                ScopeMode::Public,
                Tenant::anonymous(),
                Endpoint::new("POST", "/x"),
                Key::new("k").unwrap(),
            ),
            fingerprint: fp(b"a"),
            created_at: Timestamp::from_millis(0),
            expires_at: Timestamp::from_millis(100_000),
            attempt,
            token: FencingToken::from_u64(7),
            state,
            tombstone_until: None,
            in_progress_ambiguity: None,
        }
    }

    const T: Timestamp = Timestamp::from_millis(10_000);

    #[test]
    fn absent_executes_first_attempt() {
        assert_eq!(decide(None, &fp(b"a"), T), Decision::Execute { attempt: 1 });
    }

    #[test]
    fn expired_counts_as_absent_even_with_other_payload() {
        let r = record(
            RecordState::Completed {
                response: StoredResponse::new(200, "x"),
                completed_at: T,
            },
            1,
        );
        let later = Timestamp::from_millis(100_000);
        assert_eq!(
            decide(Some(r), &fp(b"b"), later),
            Decision::Execute { attempt: 1 }
        );
    }

    #[test]
    fn mismatched_payload_wins_over_state() {
        let live = record(
            RecordState::InProgress {
                lease_until: Timestamp::from_millis(20_000),
            },
            1,
        );
        assert_eq!(decide(Some(live), &fp(b"b"), T), Decision::Mismatch);
        let done = record(
            RecordState::Completed {
                response: StoredResponse::new(200, "x"),
                completed_at: T,
            },
            1,
        );
        assert_eq!(decide(Some(done), &fp(b"b"), T), Decision::Mismatch);
    }

    #[test]
    fn live_lease_is_in_progress_with_rounded_up_retry_after() {
        let r = record(
            RecordState::InProgress {
                lease_until: Timestamp::from_millis(11_001),
            },
            1,
        );
        assert_eq!(
            decide(Some(r), &fp(b"a"), T),
            Decision::InProgress {
                retry_after: Duration::from_secs(2)
            }
        );
    }

    /// The wait follows how long the attempt has run, up to the lease's end.
    #[test]
    fn retry_after_grows_with_the_attempt_up_to_the_lease() {
        let in_progress = |created_ms: i64, lease_until_ms: i64| {
            let mut r = record(
                RecordState::InProgress {
                    lease_until: Timestamp::from_millis(lease_until_ms),
                },
                1,
            );
            r.created_at = Timestamp::from_millis(created_ms);
            match decide(Some(r), &fp(b"a"), T) {
                Decision::InProgress { retry_after } => retry_after.as_secs(),
                other => panic!("{other:?}"),
            }
        };
        // T is 10 s. Just begun, with a 60 s lease: come back in a second.
        assert_eq!(in_progress(9_700, 69_700), 1);
        assert_eq!(in_progress(10_000, 70_000), 1);
        // Running 4.2 s: come back in 5.
        assert_eq!(in_progress(5_800, 65_800), 5);
        // Running longer than its lease has left: when the lease lapses.
        assert_eq!(in_progress(0, 13_500), 4);
    }

    #[test]
    fn expired_lease_is_taken_over_as_next_attempt() {
        let r = record(
            RecordState::InProgress {
                lease_until: Timestamp::from_millis(10_000),
            },
            3,
        );
        assert_eq!(
            decide(Some(r), &fp(b"a"), T),
            Decision::Execute { attempt: 4 }
        );
    }

    #[test]
    fn completed_replays() {
        let resp = StoredResponse::new(201, "made").with_header("Location", "/o/1");
        let r = record(
            RecordState::Completed {
                response: resp.clone(),
                completed_at: T,
            },
            1,
        );
        assert_eq!(decide(Some(r), &fp(b"a"), T), Decision::Replay(resp));
    }

    fn completed_with_tombstone() -> Record {
        let mut r = record(
            RecordState::Completed {
                response: StoredResponse::new(201, "made").with_header("location", "/o/1"),
                completed_at: T,
            },
            1,
        );
        r.tombstone_until = Some(Timestamp::from_millis(200_000));
        r
    }

    #[test]
    fn an_expired_record_with_a_live_tombstone_is_gone_and_checks_the_payload() {
        let gone = Decision::Gone {
            completed_at: T,
            status: 201,
        };
        let after_expiry = Timestamp::from_millis(150_000);
        // Not yet compacted, and compacted: the same decisions.
        for r in [
            completed_with_tombstone(),
            completed_with_tombstone().into_tombstone(after_expiry),
        ] {
            assert_eq!(decide(Some(r.clone()), &fp(b"a"), after_expiry), gone);
            assert_eq!(decide(Some(r), &fp(b"b"), after_expiry), Decision::Mismatch);
        }
        // Before expiry the record replays as usual.
        assert!(matches!(
            decide(Some(completed_with_tombstone()), &fp(b"a"), T),
            Decision::Replay(_)
        ));
    }

    #[test]
    fn a_lapsed_tombstone_counts_as_absent() {
        let end = Timestamp::from_millis(200_000);
        let compacted = completed_with_tombstone().into_tombstone(Timestamp::from_millis(150_000));
        for r in [completed_with_tombstone(), compacted] {
            assert_eq!(
                decide(Some(r.clone()), &fp(b"a"), end),
                Decision::Execute { attempt: 1 }
            );
            assert_eq!(
                decide(Some(r), &fp(b"b"), end),
                Decision::Execute { attempt: 1 }
            );
        }
    }

    #[test]
    fn compaction_keeps_only_the_completion() {
        let now = Timestamp::from_millis(150_000);
        let t = completed_with_tombstone().into_tombstone(now);
        assert_eq!(
            t.state,
            RecordState::Tombstone {
                completed_at: T,
                status: 201
            }
        );
        assert_eq!(t.expires_at, Timestamp::from_millis(200_000));
        assert!(!t.is_purgeable(now));
        assert!(t.is_purgeable(Timestamp::from_millis(200_000)));
        // A live record, an in-progress one and one without a tombstone stay as they are.
        let live = completed_with_tombstone();
        assert_eq!(live.clone().into_tombstone(T), live);
        let mut plain = completed_with_tombstone();
        plain.tombstone_until = None;
        assert_eq!(plain.clone().into_tombstone(now), plain);
        assert!(plain.is_purgeable(now));
    }
}
