//! The nemesis tests (issue 42): the real `idem` binary in network namespaces of its
//! own, partitioned from its store, cut from everything, paused past its lease, killed,
//! its store failed over, while clients send and resend keys; the `idem-nemesis`
//! checker judges each history. And the fencing that makes a paused gateway harmless.
//!
//! Run with `cargo test -p idem-gateway --test nemesis`. They need root and `ip`
//! (network namespaces) and the machine's `postgres` and `redis-server` binaries; they
//! skip loudly without them, and fail under `IDEM_REQUIRE_SERVICES=1`. The longer run
//! is `matrix::long_run`, ignored unless asked for; see the `idem-nemesis` README.

mod fencing;
mod matrix;

/// The `idem` binary under test: `IDEM_TEST_BINARY` when set (a release build), else
/// the one cargo built for this test.
pub fn binary() -> std::path::PathBuf {
    std::env::var_os("IDEM_TEST_BINARY")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_idem").into())
}
