//! The `idem` binary: see `idem --help` and the crate README.

use std::process::ExitCode;

/// Every request allocates (headers, bodies; on keyed ones the fingerprint, the record
/// and the recorded answer too); mimalloc serves that faster than glibc's allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    idem_gateway::main().await
}
