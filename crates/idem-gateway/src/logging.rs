//! Structured logs on standard error via `tracing`, written so that a log reader that
//! is slow, paused or gone never stalls nor ends serving.
//!
//! The level comes from `IDEM_LOG` (an `EnvFilter` directive such as `info` or
//! `idem_gateway=debug`), `info` by default; the access log is the target
//! `idem::access` (see [`crate::serve`]'s access module). Nothing logs credentials or
//! bodies; idempotency keys appear only at debug level: one `keyed request` line per
//! answered keyed request (see [`crate::serve`]'s front) carries the key, its endpoint,
//! the scope digest the access log names and the request id.
//!
//! Lines are not written by the thread that logs them: each goes into a bounded queue
//! (`--log-buffer-lines`) that a thread of its own writes to standard error. When the
//! queue is full (the reader is slower than the gateway, or not reading) or the write
//! fails (the reader has gone: a broken pipe), the line is dropped and counted
//! ([`dropped_lines`], the metric `idem_log_lines_dropped_total`); once a line is
//! written again, a warning says how many were dropped. The `idem listening on …`
//! lines on standard output go the same way. Rust ignores `SIGPIPE`, so a gone reader
//! is only ever a failed write.

use std::io::{self, Write};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tracing::Dispatch;
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

/// How logs are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The lines held for standard error while its reader is behind, when
/// `--log-buffer-lines` is not given: several seconds of access lines at a busy
/// gateway's rate, a few MiB at most, where the writer's own default (128 000 lines of
/// unbounded length) could hold hundreds of MiB of a stalled reader's backlog.
pub(crate) const DEFAULT_BUFFER_LINES: usize = 16_384;

/// Standard output carries a line per listener, written at start.
const STDOUT_BUFFER_LINES: usize = 64;

/// The longest wait at exit for the queued lines to be written (a reader that is not
/// reading would otherwise hold the exit forever).
const EXIT_FLUSH: Duration = Duration::from_secs(2);

/// Lines dropped so far, process-wide, as the log is (see the module docs).
static DROPPED: Dropped = Dropped {
    queues: OnceLock::new(),
    failed: AtomicU64::new(0),
    reported: AtomicU64::new(0),
};

/// Standard error's lines handed to its queue, and taken off it (written, or dropped
/// as their write failed): equal once the queue has caught up ([`Logs::settle`]).
static STDERR_SENT: AtomicU64 = AtomicU64::new(0);
static STDERR_DONE: AtomicU64 = AtomicU64::new(0);

struct Dropped {
    /// The queues' own counts of the lines they refused, full.
    queues: OnceLock<[ErrorCounter; 2]>,
    /// Lines taken off a queue whose write failed.
    failed: AtomicU64,
    /// The total the last "dropped" warning written accounted for.
    reported: AtomicU64,
}

/// How many log lines (standard error's, and standard output's listening lines) were
/// dropped since start because their reader was too slow or gone. `0` before [`init`].
pub(crate) fn dropped_lines() -> u64 {
    let queued = DROPPED.queues.get().map_or(0, |queues| {
        queues.iter().map(|q| q.dropped_lines() as u64).sum::<u64>()
    });
    queued + DROPPED.failed.load(Ordering::Relaxed)
}

/// The log's writers; hold it until the process ends, then call [`Logs::finish`].
#[must_use = "dropping the writers loses the lines still queued"]
pub(crate) struct Logs {
    stdout: NonBlocking,
    guards: [WorkerGuard; 2],
}

impl std::fmt::Debug for Logs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logs").finish_non_exhaustive()
    }
}

impl Logs {
    /// Writes `line` and a newline on standard output, never blocking nor failing: a
    /// line that cannot be written is dropped and counted like a log line.
    pub(crate) fn stdout_line(&self, line: &str) {
        let mut out = self.stdout.clone();
        // In lossy mode the queue refuses by counting, never by an error.
        let _ = out.write_all(format!("{line}\n").as_bytes());
    }

    /// Waits, `within` at most, until standard error's queue has written (or dropped)
    /// every line logged before the call: the gateway calls it before it says on
    /// standard output that it listens, so that a script or a test that waits for that
    /// line finds the start's log lines (its warnings, its limits) already written.
    pub(crate) async fn settle(&self, within: Duration) {
        let sent = STDERR_SENT.load(Ordering::Acquire);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let refused = DROPPED
                .queues
                .get()
                .map_or(0, |queues| queues[0].dropped_lines() as u64);
            if STDERR_DONE.load(Ordering::Acquire) + refused >= sent
                || tokio::time::Instant::now() >= deadline
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Writes what is queued, waiting at most a couple of seconds: a reader that is
    /// not reading must not hold the exit.
    pub(crate) fn finish(self) {
        let Logs { stdout, guards } = self;
        drop(stdout);
        let (done, wait) = std::sync::mpsc::channel();
        // Dropping a guard waits for its writer; it may also print, and panic where
        // standard output is gone, which must not change the exit status: done on a
        // thread of its own.
        let spawned = std::thread::Builder::new()
            .name("idem-log-flush".into())
            .spawn(move || {
                drop(guards);
                let _ = done.send(());
            });
        if spawned.is_ok() {
            let _ = wait.recv_timeout(EXIT_FLUSH);
        }
    }
}

/// Installs the global subscriber, its lines queued for standard error with room for
/// `buffer_lines` of them. Call once, first thing.
pub(crate) fn init(format: LogFormat, buffer_lines: usize) -> Logs {
    let (stderr, stderr_guard) = queue(buffer_lines, "idem-log-stderr", Pipe::stderr(format));
    let (stdout, stdout_guard) = queue(STDOUT_BUFFER_LINES, "idem-log-stdout", Pipe::stdout());
    let _ = DROPPED
        .queues
        .set([stderr.error_counter(), stdout.error_counter()]);
    let _ = subscriber(format, Counted(stderr)).try_init();
    Logs {
        stdout,
        guards: [stderr_guard, stdout_guard],
    }
}

/// The subscriber of the log: `IDEM_LOG`'s filter, `format`, lines to `writer`.
fn subscriber<W>(format: LogFormat, writer: W) -> Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_env("IDEM_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        // A line that cannot be written is counted, not said on standard error (the
        // very stream that failed).
        .log_internal_errors(false);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).finish().into(),
        LogFormat::Text => builder.finish().into(),
    }
}

fn queue(lines: usize, thread: &str, pipe: Pipe) -> (NonBlocking, WorkerGuard) {
    NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(lines.max(1))
        .thread_name(thread)
        .finish(pipe)
}

/// Standard error's queue, counting the lines handed to it ([`Logs::settle`]). The
/// log's subscriber writes each event in one write.
struct Counted(NonBlocking);

impl<'a> MakeWriter<'a> for Counted {
    type Writer = CountedWriter;

    fn make_writer(&'a self) -> CountedWriter {
        CountedWriter(self.0.clone())
    }
}

struct CountedWriter(NonBlocking);

impl Write for CountedWriter {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        STDERR_SENT.fetch_add(1, Ordering::AcqRel);
        self.0.write(line)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Standard error or output as the queue's writer sees it: each write is one line,
/// written whole or dropped and counted, never an error (the queue's writer would drop
/// the rest of its batch on one).
struct Pipe {
    out: Box<dyn Write + Send>,
    /// Standard error's writer says when lines were dropped, in the log's format
    /// (standard output carries only the listening lines).
    reports: Option<LogFormat>,
}

impl Pipe {
    fn stderr(format: LogFormat) -> Pipe {
        Pipe {
            out: Box::new(io::stderr()),
            reports: Some(format),
        }
    }

    fn stdout() -> Pipe {
        Pipe {
            out: Box::new(io::stdout()),
            reports: None,
        }
    }

    /// After a line got through: warns of the lines dropped since the last warning
    /// written. Written here, straight after that line, rather than logged: through
    /// the queue, the warning would meet the backlog it reports and be dropped too.
    /// Only this thread reports, so the count is read and set without a race.
    fn report_dropped(&mut self) {
        let Some(format) = self.reports else {
            return;
        };
        let total = dropped_lines();
        let reported = DROPPED.reported.load(Ordering::Relaxed);
        if total <= reported {
            return;
        }
        let line = dropped_warning(format, total - reported, total);
        // A warning that could not be written is said at the next line that can.
        if self.out.write_all(line.as_bytes()).is_ok() {
            DROPPED.reported.store(total, Ordering::Relaxed);
        }
    }
}

/// The warning that `dropped` lines (`total` since start) were dropped, as the log's
/// subscriber would write a `warn!` event of this module in `format`.
fn dropped_warning(format: LogFormat, dropped: u64, total: u64) -> String {
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
    const TARGET: &str = "idem_gateway::logging";
    const MESSAGE: &str = "log lines were dropped: the log's reader was too slow or gone \
                           (idem_log_lines_dropped_total counts them)";
    let mut now = String::new();
    let _ = SystemTime.format_time(&mut Writer::new(&mut now));
    match format {
        LogFormat::Text => {
            format!("{now}  WARN {TARGET}: {MESSAGE} dropped={dropped} dropped_total={total}\n")
        }
        LogFormat::Json => format!(
            "{{\"timestamp\":{},\"level\":\"WARN\",\"message\":{},\"dropped\":{dropped},\
             \"dropped_total\":{total},\"target\":\"{TARGET}\"}}\n",
            serde_json::Value::from(now),
            serde_json::Value::from(MESSAGE),
        ),
    }
}

impl Write for Pipe {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        // Standard output is line-buffered and standard error not: flushed here, so
        // that a failure is this line's.
        match self.out.write_all(line).and_then(|()| self.out.flush()) {
            Ok(()) => self.report_dropped(),
            Err(_) => {
                DROPPED.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.reports.is_some() {
            STDERR_DONE.fetch_add(1, Ordering::AcqRel);
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        // Each line was flushed as it was written.
        Ok(())
    }
}
