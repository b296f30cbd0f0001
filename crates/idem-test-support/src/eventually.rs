//! Waiting for something another task or process does.

use std::fmt::Display;
use std::time::Duration;

/// How long a test waits for something that takes milliseconds on an idle machine: long
/// enough that a loaded one, its cores shared with other builds and test binaries, still
/// gets there, so that only a real hang fails.
pub const WAIT: Duration = Duration::from_secs(30);

/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(10);

/// Waits until `check` holds, looking every few milliseconds; panics, saying `what` was
/// awaited, when it still does not hold after `within`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
///
/// let done = Arc::new(AtomicBool::new(false));
/// tokio::spawn({
///     let done = done.clone();
///     async move { done.store(true, Ordering::SeqCst) }
/// });
/// idem_test_support::eventually("the task ran", idem_test_support::WAIT, async || {
///     done.load(Ordering::SeqCst)
/// })
/// .await;
/// # }
/// ```
pub async fn eventually(
    what: impl Display,
    within: Duration,
    mut check: impl AsyncFnMut() -> bool,
) {
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_once_the_check_holds() {
        let mut looks = 0;
        eventually("the third look", WAIT, async || {
            looks += 1;
            looks == 3
        })
        .await;
        assert_eq!(looks, 3);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 1s waiting until never")]
    async fn panics_when_the_check_never_holds() {
        eventually("never", Duration::from_secs(1), async || false).await;
    }
}
