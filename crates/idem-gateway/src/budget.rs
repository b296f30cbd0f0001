//! The answer bytes one HTTP/2 connection may hold. HTTP/1.1 sends one answer at a
//! time, so a connection holds at most one buffered answer (up to the response limit);
//! HTTP/2 sends up to `--http2-max-concurrent-streams` at once, and a client that reads
//! none of them would make one connection hold that many buffered answers (replays of a
//! recorded answer cost no upstream call) until the client timeout resets them.
//!
//! So each HTTP/2 connection has a budget (`--http2-answer-budget`): a buffered answer
//! (one the layer holds whole, a replay or the answer it just recorded) is charged to it
//! from when it is ready until its body is done or dropped. A replay's bytes come out
//! of the store before anyone knows their size, so a request that carries an
//! `Idempotency-Key` is admitted with a reservation of the response limit (at most the
//! budget), waiting while the connection's budget is spent: a replay turns the
//! reservation into its answer's charge, and a request the layer forwards gives it
//! back as it goes upstream (an execution waits on the upstream, not on the budget).
//! An executed answer that does not fit beside the answers the connection holds is not
//! sent: it is the 503 `replay-unavailable`, with `Retry-After` (the answer is
//! recorded; a retry replays it), and its bytes are let go at once. Reservations are
//! room kept for replays, not bytes held, so they never crowd an executed answer out;
//! what a connection holds stays under twice the budget. A connection holding nothing
//! takes any answer, so a single answer is never refused, however large. Answers streamed from
//! the upstream are not charged: HTTP/2 flow control and `--client-timeout` bound them.
//!
//! A charged answer is handed to HTTP/2 in copies of [`HANDOFF`] bytes, so that the
//! answer's own buffer lives exactly as long as its charge: what a stream has handed
//! over and its client has not read yet is at most two such pieces.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use idem_tower::{Problem, ProblemKind};
use tokio::sync::Notify;
use tower::BoxError;

/// The body of answers sent to clients, as [`crate::serve::ClientBody`] names it.
type ClientBody = http_body_util::combinators::UnsyncBoxBody<Bytes, tower::BoxError>;

/// The piece a charged answer is handed to HTTP/2 in: one frame at the protocol's
/// default largest frame size.
pub(super) const HANDOFF: usize = 16 * 1024;

/// Marks an answer whose body the layer holds whole in memory.
#[derive(Debug, Clone, Copy)]
pub(super) struct Buffered;

/// A keyed request's reservation on its connection's budget, in its extensions: the
/// proxy gives it back when it forwards the request ([`Reservation::release`]).
#[derive(Debug, Clone)]
pub(crate) struct Reservation(Arc<Mutex<Option<Charge>>>);

impl Reservation {
    /// Gives the reservation back: the request goes upstream, and its answer, if the
    /// layer buffers it, is charged when it is ready.
    pub(crate) fn release(&self) {
        drop(self.take());
    }

    fn take(&self) -> Option<Charge> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// What one connection's budget has given out.
#[derive(Debug, Default)]
struct Held {
    /// Bytes of answers charged: ready, and not yet read by the client.
    answers: usize,
    /// Bytes reserved by keyed requests whose answers are not known yet.
    reserved: usize,
}

impl Held {
    fn counter(&mut self, kind: Kind) -> &mut usize {
        match kind {
            Kind::Answer => &mut self.answers,
            Kind::Reservation => &mut self.reserved,
        }
    }
}

/// One HTTP/2 connection's budget of buffered answer bytes.
#[derive(Debug, Clone)]
pub(super) struct AnswerBudget {
    limit: usize,
    /// What a keyed request reserves until its answer is known.
    reserve: usize,
    held: Arc<Mutex<Held>>,
    freed: Arc<Notify>,
}

impl AnswerBudget {
    /// A budget of `limit` bytes, none held, for answers of up to `response_limit`.
    pub(super) fn new(limit: usize, response_limit: usize) -> AnswerBudget {
        AnswerBudget {
            limit,
            reserve: response_limit.min(limit),
            held: Arc::new(Mutex::new(Held::default())),
            freed: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A reservation for a keyed request's answer, once the budget has room for it:
    /// what answers hold and what other requests reserve leave room for one more
    /// answer of the response limit (or nothing is held or reserved).
    pub(super) async fn admit(&self) -> Reservation {
        loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            {
                let mut held = self.lock();
                let taken = held.answers.saturating_add(held.reserved);
                if taken == 0 || taken.saturating_add(self.reserve) <= self.limit {
                    held.reserved += self.reserve;
                    drop(held);
                    let charge = self.charge_of(Kind::Reservation, self.reserve);
                    return Reservation(Arc::new(Mutex::new(Some(charge))));
                }
            }
            freed.await;
        }
    }

    /// `res` charged to the budget if it is a buffered answer that fits, else the 503
    /// that takes its place, for the front to answer in the request's dialect; any
    /// other answer as it is. A replay always fits: it takes
    /// the place of its `reservation`. An executed answer fits when the answers its
    /// connection holds leave room for it: reservations are room kept for replays
    /// that may come, not bytes anyone holds, so they never crowd an executed answer
    /// out (what a connection holds stays under twice the budget).
    pub(super) fn hold(
        &self,
        res: Response<ClientBody>,
        reservation: Option<Reservation>,
    ) -> Result<Response<ClientBody>, Problem> {
        let reserved = reservation.and_then(|r| r.take());
        if res.extensions().get::<Buffered>().is_none() {
            return Ok(res);
        }
        let hint = res.body().size_hint();
        let len = usize::try_from(hint.exact().unwrap_or(hint.lower())).unwrap_or(usize::MAX);
        let charge = {
            let mut held = self.lock();
            let fits = reserved.is_some()
                || held.answers == 0
                || held.answers.saturating_add(len) <= self.limit;
            fits.then(|| {
                held.answers = held.answers.saturating_add(len);
                len
            })
        };
        // The reservation (if any) goes only once the answer is charged in its place.
        drop(reserved);
        if let Some(len) = charge {
            let charge = self.charge_of(Kind::Answer, len);
            return Ok(res.map(|inner| {
                Charged {
                    inner,
                    rest: Bytes::new(),
                    _charge: charge,
                }
                .boxed_unsync()
            }));
        }
        let held = self.lock().answers;
        tracing::debug!(
            answer = len,
            held,
            budget = self.limit,
            "an HTTP/2 connection's client has not read the answers it holds; refusing one more"
        );
        Err(Problem::new(
            ProblemKind::ReplayUnavailable,
            format!(
                "this HTTP/2 connection already holds {held} bytes of answers its client \
                 has not read, and this {len}-byte answer would take it past the gateway's \
                 budget of {} bytes; the answer was not sent. Read the answers under way, \
                 then retry with the same Idempotency-Key: a recorded answer is replayed, \
                 not executed again",
                self.limit
            ),
        ))
    }

    /// The charge for `len` bytes already counted as `kind`.
    fn charge_of(&self, kind: Kind, len: usize) -> Charge {
        Charge {
            held: self.held.clone(),
            freed: self.freed.clone(),
            kind,
            len,
        }
    }
}

/// What a charge counts as.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Answer,
    Reservation,
}

/// Bytes counted in a budget until dropped.
#[derive(Debug)]
struct Charge {
    held: Arc<Mutex<Held>>,
    freed: Arc<Notify>,
    kind: Kind,
    len: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            let counter = held.counter(self.kind);
            *counter = counter.saturating_sub(self.len);
        }
        self.freed.notify_waiters();
    }
}

/// A charged answer's body, handed over in copies of at most [`HANDOFF`] bytes.
struct Charged {
    inner: ClientBody,
    /// What is left of the data frame being handed over.
    rest: Bytes,
    _charge: Charge,
}

impl Charged {
    /// The next piece of `rest`; once it is all handed over, the reference to the
    /// answer's buffer is let go.
    fn piece(&mut self) -> Bytes {
        let n = self.rest.len().min(HANDOFF);
        let piece = Bytes::copy_from_slice(&self.rest[..n]);
        self.rest.advance(n);
        if self.rest.is_empty() {
            self.rest = Bytes::new();
        }
        piece
    }
}

impl Body for Charged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if !this.rest.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(this.piece()))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    this.rest = data;
                    Poll::Ready(Some(Ok(Frame::data(this.piece()))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        match inner.exact() {
            Some(n) => SizeHint::with_exact(n + rest),
            None => {
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + rest);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + rest);
                }
                hint
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::Full;

    use super::*;

    /// [`AnswerBudget::hold`], its refusal answered as the front answers it to an
    /// HTTP client of the default profile.
    fn hold(
        budget: &AnswerBudget,
        res: Response<ClientBody>,
        reservation: Option<Reservation>,
    ) -> Response<ClientBody> {
        budget.hold(res, reservation).unwrap_or_else(|refused| {
            let answer = refused.to_response();
            answer.map(|b| Full::new(b).map_err(|never| match never {}).boxed_unsync())
        })
    }

    fn buffered(len: usize) -> Response<ClientBody> {
        let mut res = Response::new(
            Full::new(Bytes::from(vec![7u8; len]))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        res.extensions_mut().insert(Buffered);
        res
    }

    #[tokio::test]
    async fn buffered_answers_beyond_the_budget_are_refused_until_the_held_ones_are_done() {
        let budget = AnswerBudget::new(10_000, 8_000);
        // The first answer fits whatever its size.
        let big = hold(&budget, buffered(50_000), None);
        assert_eq!(big.status(), 200);
        let refused = hold(&budget, buffered(1), None);
        assert_eq!(refused.status(), 503);
        assert!(refused.headers().contains_key(http::header::RETRY_AFTER));
        assert_eq!(
            refused.extensions().get::<ProblemKind>(),
            Some(&ProblemKind::ReplayUnavailable)
        );
        // Read whole: the bytes are the answer's, in pieces of HANDOFF at most.
        let mut body = big.into_body();
        let mut read = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= HANDOFF);
            read.extend_from_slice(&data);
        }
        assert_eq!(read, vec![7u8; 50_000]);
        drop(body);
        // Done and dropped: the budget is free again, and answers fit up to it.
        let a = hold(&budget, buffered(6_000), None);
        let b = hold(&budget, buffered(4_000), None);
        let c = hold(&budget, buffered(1), None);
        assert_eq!(
            (
                a.status().as_u16(),
                b.status().as_u16(),
                c.status().as_u16()
            ),
            (200, 200, 503)
        );
        // Answers that are not buffered are never charged.
        let streamed = Response::new(
            Full::new(Bytes::from(vec![1u8; 50_000]))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        assert_eq!(hold(&budget, streamed, None).status(), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn keyed_requests_wait_for_room_and_a_replay_takes_its_reservation() {
        let budget = AnswerBudget::new(10_000, 8_000);
        let first = budget.admit().await;
        // 8 000 reserved: the next one waits until the first is answered.
        let second = budget.admit();
        let mut second = std::pin::pin!(second);
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(60), second.as_mut())
                .await
                .is_err()
        );
        // A 1 000-byte replay: the reservation becomes its charge; 9 000 left, and the
        // waiting request is admitted.
        let replay = hold(&budget, buffered(1_000), Some(first.clone()));
        assert_eq!(replay.status(), 200);
        let second = second.await;
        // Forwarded upstream, it gives its reservation back.
        second.release();
        assert_eq!(budget.lock().answers, 1_000);
        // Its executed answer is charged when ready, as an answer without reservation.
        let executed = hold(&budget, buffered(9_500), Some(second));
        assert_eq!(executed.status(), 503);
        drop(replay);
        assert_eq!(budget.lock().answers, 0);
    }

    #[tokio::test]
    async fn reservations_never_crowd_out_an_executed_answer() {
        // Two keyed requests waiting on the store reserve the whole budget; the answer
        // of a third, executed upstream, is sent all the same: nobody holds those bytes.
        let budget = AnswerBudget::new(16_000, 8_000);
        let waiting = [budget.admit().await, budget.admit().await];
        assert_eq!(budget.lock().reserved, 16_000);
        let executed = hold(&budget, buffered(300), None);
        assert_eq!(executed.status(), 200);
        assert_eq!(budget.lock().answers, 300);
        // What the client has not read still bounds executed answers.
        let big = hold(&budget, buffered(15_800), None);
        assert_eq!(big.status(), 503);
        // A replay takes its reservation's place whatever the answers hold.
        let replay = hold(&budget, buffered(8_000), Some(waiting[0].clone()));
        assert_eq!(replay.status(), 200);
        let held = budget.lock();
        assert_eq!((held.answers, held.reserved), (8_300, 8_000));
        drop(held);
        drop((executed, replay, waiting));
        let held = budget.lock();
        assert_eq!((held.answers, held.reserved), (0, 0));
    }

    #[tokio::test]
    async fn a_charged_body_keeps_its_exact_size_and_its_trailers() {
        let budget = AnswerBudget::new(1 << 20, 1 << 20);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let inner = idem_tower::IdempotencyBody::<ClientBody>::buffered_with_trailers(
            Bytes::from(vec![1u8; 40_000]),
            Some(trailers.clone()),
        );
        let mut res = Response::new(inner.boxed_unsync());
        res.extensions_mut().insert(Buffered);
        let body = hold(&budget, res, None).into_body();
        assert_eq!(body.size_hint().exact(), Some(40_000));
        let collected = body.collect().await.unwrap();
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(collected.to_bytes().len(), 40_000);
    }
}
