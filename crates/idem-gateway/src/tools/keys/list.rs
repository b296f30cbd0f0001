//! `idem keys list`: records as JSON lines, paged through the store (the admin
//! listener's `GET /keys` lists the same lines through a running gateway).

use std::process::ExitCode;

use idem_core::{Clock, ListCursor, ListQuery, MAX_LIST_LIMIT, Store, SystemClock};

use crate::cli::ListArgs;
use crate::exit::Failure;
use crate::inspect::{line_json, parse_age, parse_state};

/// `idem keys list`: pages through the store, printing one JSON line per record, at
/// most `--limit` of them; says on standard error where to resume when it stops there.
pub(super) async fn run(args: ListArgs) -> Result<ExitCode, Failure> {
    let mut query = ListQuery::new();
    query.state = args.state.as_deref().map(parse_state).transpose()?;
    query.older_than = args.older_than.as_deref().map(parse_age).transpose()?;
    query.ambiguous = args.ambiguous;
    query.after = args
        .after
        .as_deref()
        .map(|c| ListCursor::parse(c).ok_or_else(|| format!("--after {c:?} is no cursor")))
        .transpose()?;
    let store = super::open(&args.store).await?;
    let result = print_pages(&*store, query, args.limit).await;
    store.close().await;
    result.map(|()| ExitCode::SUCCESS).map_err(Failure::runtime)
}

async fn print_pages(store: &dyn Store, mut query: ListQuery, limit: usize) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let mut left = limit;
    // A store may list a record twice (Redis, while its table shrinks: see
    // `Store::list`); one run prints each once.
    let mut printed = std::collections::HashSet::new();
    while left > 0 {
        query.limit = left.min(MAX_LIST_LIMIT);
        let page = store.list(&query).await.map_err(|e| e.to_string())?;
        let now = SystemClock.now();
        for record in &page.records {
            if !printed.insert(record.scope.digest()) {
                continue;
            }
            let line = serde_json::to_string(&line_json(record, now)).expect("json");
            writeln!(out, "{line}").map_err(|e| e.to_string())?;
            left -= 1;
        }
        match page.next {
            Some(next) if left == 0 => {
                eprintln!("idem: stopped at --limit {limit}; resume with --after {next}");
            }
            Some(next) => query.after = Some(next),
            None => break,
        }
    }
    Ok(())
}
