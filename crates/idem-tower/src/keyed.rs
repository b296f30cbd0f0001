//! [`Keyed`]: one keyed request's context, which its stages share as pingora's phases
//! share one `CTX`. Each stage is a small step that borrows it; the request's head, its
//! body and the inner service move from step to step, until the handler's run takes
//! them.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use http::{Method, Response};
use idem_core::Store;

use crate::IdempotencyBody;
use crate::config::Config;
use crate::handled::Handled;
use crate::observer::{Observer, Outcome};
use crate::plan::AnswerRules;
use crate::problem::Problem;
use crate::profile::Dialect;
use crate::shared::Shared;

/// What every stage of one keyed request reads: what the layer shares, and what the
/// request's plan settled for it. Made once, after admission; never cloned.
pub(crate) struct Keyed<St> {
    pub(crate) shared: Arc<Shared<St>>,
    /// The method the request is decided on (SPEC S14), as its endpoint names it: a
    /// method-override header's, where it must be.
    pub(crate) method: Method,
    /// How long its lease lasts, and is renewed for.
    pub(crate) lease_for: Duration,
    /// What its route says of its answer.
    pub(crate) answers: AnswerRules,
    /// Set while its execution is a duplicate waiting between two reserves (SPEC S15),
    /// holding nothing: see [`Execution`](crate::detach::Execution).
    pub(crate) parked: Arc<AtomicBool>,
    /// Whether no verified source named its tenant (the tenant headers, or none), so
    /// that its new key counts under the layer's rate of unverified new keys.
    pub(crate) unverified: bool,
}

impl<St: Store> Keyed<St> {
    pub(crate) fn config(&self) -> &Config {
        &self.shared.config
    }

    pub(crate) fn observer(&self) -> &dyn Observer {
        &*self.shared.config.observer
    }

    pub(crate) fn store(&self) -> &St {
        &self.shared.store
    }

    /// How the layer's own answers to this request are written.
    pub(crate) fn dialect(&self) -> Dialect {
        let (grpc, profile) = (self.answers.grpc.is_some(), self.answers.profile);
        Dialect { grpc, profile }
    }

    /// The answer `problem` to the request, refused before anything was reserved.
    pub(crate) fn rejected<B>(&self, problem: &Problem) -> Response<IdempotencyBody<B>> {
        rejected(self.observer(), problem, self.dialect())
    }

    /// `answer`, the request's refusal once it is scoped: counted, and marked with
    /// `scope`.
    pub(crate) fn refused_in<B>(
        &self,
        scope: &idem_core::Scope,
        answer: Response<bytes::Bytes>,
    ) -> Response<IdempotencyBody<B>> {
        self.observer().outcome(Outcome::Rejected);
        let mut response = answer.map(IdempotencyBody::buffered);
        Handled::keyed(&mut response, Outcome::Rejected, scope, None);
        response
    }
}

/// The answer `problem` in `dialect` to a request refused before anything was reserved.
pub(crate) fn rejected<B>(
    observer: &dyn Observer,
    problem: &Problem,
    dialect: Dialect,
) -> Response<IdempotencyBody<B>> {
    observer.outcome(Outcome::Rejected);
    let mut response = problem.answer(dialect).map(IdempotencyBody::buffered);
    Handled::mark(&mut response, Outcome::Rejected);
    response
}
