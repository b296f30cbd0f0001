//! Structured logs on standard error via `tracing`.
//!
//! The level comes from `IDEM_LOG` (an `EnvFilter` directive such as `info` or
//! `idem_gateway=debug`), `info` by default; the access log is the target
//! `idem::access` (see [`crate::serve`]'s access module). Nothing logs credentials or
//! bodies; idempotency keys appear only at debug level.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global subscriber. Call once, first thing.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("IDEM_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
