//! Stages 3 and 4 of a keyed request (SPEC S5, S6, S7), in steps over its [`Keyed`]
//! context: what the handler's run means for the key, the key settled (`settle.rs`),
//! and the answer the client gets.

use bytes::Bytes;
use http::response::Parts;
use http::{HeaderMap, Response};
use idem_core::{Ambiguity, Lease, Store};

use crate::IdempotencyBody;
use crate::detach::panic_message;
use crate::disposition::Disposition;
use crate::execute::{Answered, Failed, Ran};
use crate::handled::Handled;
use crate::in_flight::InFlightGuard;
use crate::keyed::Keyed;
use crate::observer::Outcome;
use crate::operation_state::OperationState;
use crate::problem::{Problem, ProblemKind};
use crate::profile::Dialect;
use crate::settle::{KeyWrite, Settled, stored_response};

/// An answer read whole, or the problem in its place, and what it means for the key.
struct Whole {
    head: Parts,
    body: Bytes,
    trailers: Option<HeaderMap>,
    disposition: Disposition,
    /// Set when the run's outcome cannot be known: reported, and kept with the answer
    /// when it is recorded.
    ambiguous: Option<Ambiguity>,
}

impl Whole {
    /// `problem`'s answer in `dialect`, in place of the handler's.
    fn problem(
        problem: &Problem,
        dialect: Dialect,
        disposition: Disposition,
        ambiguous: Option<Ambiguity>,
    ) -> Whole {
        let (head, body) = problem.answer(dialect).into_parts();
        let trailers = None;
        Whole {
            head,
            body,
            trailers,
            disposition,
            ambiguous,
        }
    }
}

impl<St: Store> Keyed<St> {
    /// Stages 3–4: settles the key held by `lease` as the handler's run says, and makes
    /// the answer the client gets.
    pub(crate) async fn conclude<B>(
        &self,
        lease: Lease,
        ran: Ran<B>,
        guard: InFlightGuard,
    ) -> Response<IdempotencyBody<B>> {
        let whole = match ran {
            Ok(Ok(Answered::Whole(head, body, trailers, disposition))) => {
                let ambiguous = None;
                Whole {
                    head,
                    body,
                    trailers,
                    disposition,
                    ambiguous,
                }
            }
            Ok(Ok(Answered::Released(head, body))) => {
                return self
                    .streamed(head, body, KeyWrite::Release, lease, guard)
                    .await;
            }
            Ok(Ok(Answered::Referenced(head, body, reference))) => {
                let extra = &self.answers.extra_headers;
                let stored = stored_response(self.config(), extra, &head, &Bytes::new(), None)
                    .with_reference(reference.as_str());
                let write = KeyWrite::Complete(stored);
                return self.streamed(head, body, write, lease, guard).await;
            }
            Ok(Err(failed)) => self.failed(failed, lease.recovered()),
            Err(panic) => {
                let panic = panic_message(&*panic);
                tracing::error!(panic, "handler panicked; recording a 500");
                failed_answer(Ambiguity::HandlerFailed, self.dialect())
            }
        };
        self.settled(whole, lease, guard).await
    }

    /// An answer passed on as it streams: released, or recorded as a reference
    /// (`write`).
    async fn streamed<B>(
        &self,
        mut head: Parts,
        body: B,
        write: KeyWrite,
        lease: Lease,
        guard: InFlightGuard,
    ) -> Response<IdempotencyBody<B>> {
        let (outcome, disposition) = match write {
            KeyWrite::Release => (Outcome::Released, Disposition::Release),
            KeyWrite::Complete(_) => (Outcome::Executed, Disposition::Record),
        };
        self.observer().outcome(outcome);
        let handled = Handled::ran(outcome, &lease);
        let state = match disposition {
            Disposition::Release => OperationState::of_released(head.status, lease.recovered()),
            Disposition::Record | Disposition::KeepInProgress => OperationState::Completed,
        };
        state.mark(&mut head.headers);
        self.settle(lease, write, guard).await;
        pass_on(&mut head.extensions, disposition);
        head.extensions.insert(handled);
        Response::from_parts(head, IdempotencyBody::stream(body))
    }

    /// The problem in place of an answer that cannot be recorded as it is, and what it
    /// means for the key; for a `recovered` attempt, whose key an earlier attempt may
    /// have acted on, a released key's state is unknown.
    fn failed(&self, failed: Failed, recovered: bool) -> Whole {
        let dialect = self.dialect();
        match failed {
            Failed::TooLarge => {
                let limit = self.config().response_limit;
                tracing::error!(
                    limit,
                    "the handler's answer is over the response limit; recording a 500 in its place"
                );
                let detail = format!(
                    "the request was executed, but its answer is over the {limit}-byte limit \
                     for recorded answers and cannot be kept; this answer is final for this key"
                );
                let problem = Problem::new(ProblemKind::ResponseTooLarge, detail);
                let ambiguous = Some(Ambiguity::AnswerTooLarge);
                Whole::problem(&problem, dialect, Disposition::Record, ambiguous)
            }
            Failed::Upstream(failure, problem) => {
                self.observer().upstream_failed(failure);
                let (disposition, ambiguous) = (failure.disposition(), failure.ambiguity());
                let problem = match disposition {
                    Disposition::Release if recovered => problem.in_state(OperationState::Unknown),
                    Disposition::Release | Disposition::Record | Disposition::KeepInProgress => {
                        problem
                    }
                };
                Whole::problem(&problem, dialect, disposition, ambiguous)
            }
            Failed::Handler(e) => {
                tracing::error!(error = %e, "handler failed after it started; recording a 500");
                failed_answer(Ambiguity::HandlerFailed, dialect)
            }
        }
    }

    /// Settles the key as `whole` says (SPEC S6, S7), and makes the answer: the record
    /// another attempt's, where one took this attempt's key over.
    async fn settled<B>(
        &self,
        whole: Whole,
        lease: Lease,
        guard: InFlightGuard,
    ) -> Response<IdempotencyBody<B>> {
        let observer = self.observer();
        let Whole {
            mut head,
            body,
            trailers,
            disposition,
            ambiguous,
        } = whole;
        if let Some(reason) = ambiguous {
            observer.ambiguous_outcome(reason, &lease.scope.digest());
        }
        let outcome = match disposition {
            Disposition::Record => Outcome::Executed,
            Disposition::Release => Outcome::Released,
            Disposition::KeepInProgress => Outcome::KeptInProgress,
        };
        observer.outcome(outcome);
        let handled = Handled::ran(outcome, &lease);
        // A problem says its own state; the handler's answer gets what its disposition
        // means.
        if head.extensions.get::<ProblemKind>().is_none() {
            let state = match disposition {
                Disposition::Record => OperationState::Completed,
                // A gRPC call's status, in its trailers, released it: S18's codes are
                // S6's statuses for gRPC.
                Disposition::Release if self.answers.grpc.is_some() && !lease.recovered() => {
                    OperationState::NotStarted
                }
                Disposition::Release => OperationState::of_released(head.status, lease.recovered()),
                Disposition::KeepInProgress => OperationState::Unknown,
            };
            state.mark(&mut head.headers);
        }
        match disposition {
            Disposition::Record => {
                let extra = &self.answers.extra_headers;
                let mut stored =
                    stored_response(self.config(), extra, &head, &body, trailers.as_ref());
                if let Some(reason) = ambiguous {
                    stored = stored.with_ambiguity(reason);
                }
                let scope = lease.scope.clone();
                let write = KeyWrite::Complete(stored);
                let settled = self.settle(lease, write, guard).await;
                if settled == Settled::Fenced
                    && let Some(superseded) = self.superseded(&scope).await
                {
                    return superseded;
                }
            }
            // Released answers left the handler early, streaming: here, the problem for
            // an upstream that never got the request.
            Disposition::Release => {
                self.settle(lease, KeyWrite::Release, guard).await;
            }
            Disposition::KeepInProgress => {
                // The upstream may still act: the record keeps why, for the listing.
                if let Some(reason) = ambiguous
                    && let Err(e) = self.store().mark_ambiguous(&lease, reason).await
                {
                    tracing::warn!(error = %e, %reason, "keeping the ambiguity reason failed");
                }
                drop(guard);
            }
        }
        pass_on(&mut head.extensions, disposition);
        head.extensions.insert(handled);
        Response::from_parts(
            head,
            IdempotencyBody::buffered_with_trailers(body, trailers),
        )
    }
}

/// Clears the extensions of an answer passed on to the client. A recorded answer keeps
/// none, so that it and its replays look alike; one that is not recorded keeps its
/// [`ProblemKind`], which marks it as no answer of the upstream's to layers outside
/// (the idem gateway makes such answers readable across origins).
fn pass_on(extensions: &mut http::Extensions, disposition: Disposition) {
    let kind = extensions.remove::<ProblemKind>();
    extensions.clear();
    if let (Some(kind), Disposition::Release | Disposition::KeepInProgress) = (kind, disposition) {
        extensions.insert(kind);
    }
}

/// The 500 `handler-failed` recorded for a handler that failed or panicked after it
/// started: it may have had effects.
fn failed_answer(ambiguous: Ambiguity, dialect: Dialect) -> Whole {
    let problem = Problem::new(
        ProblemKind::HandlerFailed,
        "the request failed while it was being processed and may have had effects; \
         this answer is final for this key",
    );
    Whole::problem(&problem, dialect, Disposition::Record, Some(ambiguous))
}
