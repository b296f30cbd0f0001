//! The kit's cases by name: what each checks ([`Case`], [`CASES`]), running one
//! ([`Case::run`], [`Case::check`]), and what a failure says ([`Violation`]).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::{ManualClock, Store};

/// One case of the store contract: its name (the test the
/// [`store_contract_tests!`](crate::store_contract_tests) macro generates for it, and
/// the function of that name in [`cases`](super::cases)), the SPEC section it holds the
/// store to, and the invariant it checks in a few words.
///
/// A store that breaks the invariant fails the case with a [`Violation`] naming both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Case {
    /// The case's name, e.g. `concurrent_reservers_exactly_one_wins`.
    pub name: &'static str,
    /// The SPEC section it checks, e.g. `S10`.
    pub section: &'static str,
    /// The invariant it checks, e.g. `insert-if-absent`.
    pub invariant: &'static str,
}

/// A case that failed: which one, and what the store did instead. Its text names the
/// SPEC section and the invariant first, then what was seen, then the case:
///
/// ```text
/// S10 insert-if-absent: 64 of 64 concurrent reservations of one scope won; exactly one may [store contract case `concurrent_reservers_exactly_one_wins`]
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Violation {
    /// The case that failed.
    pub case: Case,
    /// What the store did instead: the failed check's own message.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {} [store contract case `{}`]",
            self.case.section, self.case.invariant, self.message, self.case.name
        )
    }
}

impl std::error::Error for Violation {}

impl Case {
    /// The case named `name`, if the kit has one.
    pub fn named(name: &str) -> Option<Case> {
        CASES.iter().copied().find(|c| c.name == name)
    }

    /// Runs the case against `store`, which reads time from `clock`. `Err` says which
    /// invariant the store broke and how; a store error the case did not expect (the
    /// server went away) is reported the same way, with the error in the message.
    ///
    /// Give each case a store of its own (or a namespace of its own on a shared
    /// server): a case may assume no other case's records are in its way, but not that
    /// the store is empty. Run it on a multi-threaded tokio runtime: the concurrency
    /// cases spawn 32 to 64 tasks that call the store at once through an `Arc`.
    pub async fn run<S: Store>(self, store: S, clock: ManualClock) -> Result<(), Violation> {
        let outcome = CatchUnwind(Box::pin(dispatch(self.name, store, clock))).await;
        match outcome {
            Ok(true) => Ok(()),
            Ok(false) => unreachable!("every case in CASES dispatches"),
            Err(panic) => Err(Violation {
                case: self,
                message: panic_message(&*panic),
            }),
        }
    }

    /// [`run`](Self::run), panicking with the [`Violation`]'s text when the store
    /// breaks the invariant: what a `#[test]` calls.
    pub async fn check<S: Store>(self, store: S, clock: ManualClock) {
        if let Err(violation) = self.run(store, clock).await {
            panic!("{violation}");
        }
    }
}

/// The text of a panic's payload: what `panic!` and the `assert` macros were given.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "the case panicked with a payload that is not text".to_owned()
    }
}

/// A future whose panic, on any poll, becomes its output's `Err`: a failed assertion
/// deep in a case becomes a [`Violation`] without a spawned task, so a case's future
/// need not be `Send` or `'static`.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

crate::__store_contract_catalogue!(@table);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_named_once_and_cites_a_section() {
        let mut names: Vec<_> = CASES.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CASES.len(), "a case listed twice");
        for case in CASES {
            assert_eq!(Case::named(case.name), Some(*case));
            let number = case.section.strip_prefix('S').expect("a SPEC section");
            assert!(number.parse::<u8>().is_ok(), "{case:?}");
            assert!(!case.invariant.is_empty(), "{case:?}");
        }
        assert_eq!(Case::named("no_such_case"), None);
    }

    #[test]
    fn a_violation_names_the_section_and_invariant_first() {
        let case = Case::named("concurrent_reservers_exactly_one_wins").expect("a case");
        let violation = Violation {
            case,
            message: "2 of 64 won".into(),
        };
        assert_eq!(
            violation.to_string(),
            "S10 insert-if-absent: 2 of 64 won \
             [store contract case `concurrent_reservers_exactly_one_wins`]"
        );
    }
}
