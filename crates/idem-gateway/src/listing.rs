//! Listing records for operators (`GET /keys?state=…&older_than=…&ambiguous=true` on
//! the admin listener, `idem keys list`): the parameters both take, and the JSON line
//! each record is printed as.

use std::process::ExitCode;
use std::time::Duration;

use idem_core::{
    Clock, Endpoint, ListCursor, ListQuery, MAX_LIST_LIMIT, Record, RecordState, StateFilter,
    Store, SystemClock, Timestamp,
};
use serde_json::{Value, json};

use crate::cli::ListArgs;
use crate::inspect::millis_json;

/// The listing parameters an operator gives, by name (`state`, `older_than`,
/// `ambiguous`, `limit`, `after`), as a query; an error names what is wrong.
pub fn query_from_params<'a>(
    params: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<ListQuery, String> {
    let mut query = ListQuery::new();
    for (name, value) in params {
        match name {
            "state" => query.state = Some(parse_state(value)?),
            "older_than" => query.older_than = Some(parse_age(value)?),
            "ambiguous" => {
                query.ambiguous = match value {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    other => return Err(format!("ambiguous={other:?}: give true or false")),
                }
            }
            "limit" => query.limit = parse_limit(value)?,
            "after" => {
                query.after = Some(ListCursor::parse(value).ok_or_else(|| {
                    format!("after={value:?} is no cursor: pass the Idem-Next-Cursor of a page")
                })?)
            }
            other => {
                return Err(format!(
                    "unknown parameter {other:?}: a listing takes state, older_than, \
                     ambiguous, limit and after; one key's record takes key, tenant and \
                     endpoint"
                ));
            }
        }
    }
    Ok(query)
}

/// `in_progress` or `completed`.
pub fn parse_state(value: &str) -> Result<StateFilter, String> {
    StateFilter::parse(value)
        .ok_or_else(|| format!("state={value:?}: give in_progress or completed"))
}

/// An age such as `5m`, `90s` or `1h`.
pub fn parse_age(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value.trim())
        .map_err(|e| format!("older_than={value:?}: {e} (examples: 90s, 5m, 1h)"))
}

/// A page size from 1 to [`MAX_LIST_LIMIT`].
pub fn parse_limit(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=MAX_LIST_LIMIT).contains(&n) => Ok(n),
        _ => Err(format!(
            "limit={value:?}: give a whole number from 1 to {MAX_LIST_LIMIT}"
        )),
    }
}

/// One listed record, on one line: its scope (the digest the gateway's logs name it
/// by, the key, the stored tenant, the endpoint), state, attempt, times, the answer's
/// status when completed, and why its outcome is ambiguous, if it is. No body and no
/// header: `GET /keys?key=…` shows the whole record.
pub fn line_json(record: &Record, now: Timestamp) -> Value {
    let (state, status, lease_until) = match &record.state {
        RecordState::InProgress { lease_until } => {
            ("in_progress", None, Some(millis_json(*lease_until)))
        }
        RecordState::Completed { response, .. } => ("completed", Some(response.status), None),
        // Never listed (`ListQuery::matches`), but a line for one says what it is.
        RecordState::Tombstone { status, .. } => ("tombstone", Some(*status), None),
    };
    json!({
        "scope": record.scope.digest(),
        "key": record.scope.key().as_str(),
        "tenant": record.scope.tenant().as_str(),
        "endpoint": record.scope.endpoint().map(Endpoint::as_str),
        "state": state,
        "attempt": record.attempt,
        "created_at": millis_json(record.created_at),
        "expires_at": millis_json(record.expires_at),
        "lease_until": lease_until,
        "status": status,
        "ambiguous": record.ambiguity(now).map(|a| a.as_str()),
    })
}

/// `idem keys list`: pages through the store, printing one JSON line per record, at
/// most `--limit` of them; says on standard error where to resume when it stops there.
pub async fn run(args: ListArgs) -> ExitCode {
    match run_inner(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idem: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

async fn run_inner(args: ListArgs) -> Result<ExitCode, crate::exit::Failure> {
    let mut query = ListQuery::new();
    query.state = args.state.as_deref().map(parse_state).transpose()?;
    query.older_than = args.older_than.as_deref().map(parse_age).transpose()?;
    query.ambiguous = args.ambiguous;
    query.after = args
        .after
        .as_deref()
        .map(|c| ListCursor::parse(c).ok_or_else(|| format!("--after {c:?} is no cursor")))
        .transpose()?;
    let store = crate::inspect::open(&args.store).await?;
    let result = print_pages(&*store, query, args.limit).await;
    store.close().await;
    result
        .map(|()| ExitCode::SUCCESS)
        .map_err(crate::exit::Failure::runtime)
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
