//! Records as operators see them, for the admin listener's `/keys` routes and for
//! `idem keys show|purge|list` alike: a scope from what an operator types, a record as
//! JSON, a listing's parameters and its one-line records, and the purge of expired
//! records. One module, so that both answer the same question the same way.

use std::time::Duration;

use idem_core::{
    Endpoint, Key, ListCursor, ListQuery, MAX_LIST_LIMIT, Record, RecordState, Scope, StateFilter,
    Store, SweeperConfig, Tenant, Timestamp, sweep_once,
};
use serde_json::{Value, json};

/// An instant as JSON for operators: its milliseconds and its RFC 3339 text.
pub(crate) fn millis_json(t: Timestamp) -> Value {
    json!({ "unix_ms": t.as_millis(), "utc": t.to_rfc3339() })
}

/// Builds a record's scope from what an operator types.
///
/// `key` is parsed like the header (quoted or bare); `tenant` is the stored tenant name
/// (`anonymous` when absent); `endpoint` is `METHOD /route` (public scope mode) or absent
/// (internal mode).
pub(crate) fn scope_for(
    key: &str,
    tenant: Option<&str>,
    endpoint: Option<&str>,
) -> Result<Scope, String> {
    let key = Key::parse(key.as_bytes()).map_err(|e| e.to_string())?;
    let tenant = tenant.map_or_else(Tenant::anonymous, Tenant::new);
    let endpoint = endpoint
        .map(|e| {
            let (method, route) = e
                .trim()
                .split_once(' ')
                .ok_or_else(|| format!("endpoint {e:?} must be `METHOD /path`"))?;
            Ok::<_, String>(Endpoint::new(method, route.trim()))
        })
        .transpose()?;
    Ok(Scope::from_parts(tenant, endpoint, key))
}

/// A record as JSON for operators. The body is shown as text when it is UTF-8, else
/// as hex; header values likewise.
pub(crate) fn record_json(record: &Record, now: Timestamp) -> Value {
    let bytes_json = |b: &[u8]| match std::str::from_utf8(b) {
        Ok(s) => json!({ "text": s }),
        Err(_) => json!({ "hex": hex_string(b) }),
    };
    let state = match &record.state {
        RecordState::InProgress { lease_until } => json!({
            "state": "in_progress",
            "lease_until": millis_json(*lease_until),
            "lease_alive": *lease_until > now,
        }),
        RecordState::Completed {
            response,
            completed_at,
        } => json!({
            "state": "completed",
            "completed_at": millis_json(*completed_at),
            "response": {
                "status": response.status,
                "headers": response
                    .http_headers()
                    .map(|(n, v)| json!({ "name": n, "value": bytes_json(v) }))
                    .collect::<Vec<_>>(),
                // Where a replay renders the body from, when it is recorded as a
                // reference (SPEC S6); the body is then empty.
                "reference": response.reference(),
                "body": bytes_json(&response.body),
                "body_len": response.body.len(),
                // The id of the key the answer is sealed with (SPEC S17), when read
                // without the keys (`idem keys show`): headers and body are then the
                // ciphertext's. The admin listener reads through the keys.
                "sealed_with": response.sealed_by(),
            },
            "tombstone_until": record.tombstone_until.map(millis_json),
        }),
        // What is left of a completed record after its TTL (SPEC S16): it refuses a
        // retry with 410 until `expires_at`.
        RecordState::Tombstone {
            completed_at,
            status,
        } => json!({
            "state": "tombstone",
            "completed_at": millis_json(*completed_at),
            "status": status,
        }),
    };
    json!({
        "key": record.scope.key().as_str(),
        // The name the access log (`scope=`) and `idem keys list` give the record:
        // what an operator searches the logs for, from a customer's key.
        "scope": record.scope.digest(),
        "tenant": record.scope.tenant().as_str(),
        "endpoint": record.scope.endpoint().map(Endpoint::as_str),
        "fingerprint": record.fingerprint.to_hex(),
        "attempt": record.attempt,
        "created_at": millis_json(record.created_at),
        "expires_at": millis_json(record.expires_at),
        "expired": record.is_expired(now),
        "record": state,
    })
}

fn hex_string(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Purges every expired record in bounded batches; returns how many.
pub(crate) async fn purge_expired(store: &dyn Store) -> usize {
    let mut total = 0;
    // Each sweep is bounded; loop until one comes back empty so the command finishes
    // the job on a large backlog.
    loop {
        let n = sweep_once(store, SweeperConfig::default()).await;
        total += n;
        if n == 0 {
            return total;
        }
    }
}

/// The listing parameters an operator gives, by name (`state`, `older_than`,
/// `ambiguous`, `limit`, `after`), as a query; an error names what is wrong.
pub(crate) fn query_from_params<'a>(
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
pub(crate) fn parse_state(value: &str) -> Result<StateFilter, String> {
    StateFilter::parse(value)
        .ok_or_else(|| format!("state={value:?}: give in_progress or completed"))
}

/// An age such as `5m`, `90s` or `1h`.
pub(crate) fn parse_age(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value.trim())
        .map_err(|e| format!("older_than={value:?}: {e} (examples: 90s, 5m, 1h)"))
}

/// A page size from 1 to [`MAX_LIST_LIMIT`].
pub(crate) fn parse_limit(value: &str) -> Result<usize, String> {
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
pub(crate) fn line_json(record: &Record, now: Timestamp) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{
        Clock, Fingerprint, MemoryStore, Reservation, ReserveRequest, ScopeMode, StoredResponse,
        SystemClock,
    };

    #[test]
    fn scope_for_matches_the_layers_scope() {
        let s = scope_for(
            "\"k-1\"",
            Some("hmac-sha256:ab"),
            Some("post /v1/orders/{id}"),
        )
        .unwrap();
        let expected = Scope::new(
            ScopeMode::Public,
            Tenant::new("hmac-sha256:ab"),
            Endpoint::new("POST", "/v1/orders/{id}"),
            Key::new("k-1").unwrap(),
        );
        assert_eq!(s, expected);
        let internal = scope_for("k-1", None, None).unwrap();
        assert_eq!(internal.tenant(), &Tenant::anonymous());
        assert_eq!(internal.endpoint(), None);
        assert!(scope_for("k", None, Some("/no-method")).is_err());
        assert!(scope_for("", None, None).is_err());
    }

    /// A record kept "for ever" (a TTL that saturates the expiry) shows its times like
    /// any other, rather than failing to format a year past 9999.
    #[test]
    fn times_past_the_year_9999_still_show() {
        let far = millis_json(Timestamp::from_millis(i64::MAX));
        assert_eq!(far["unix_ms"], i64::MAX);
        assert!(
            far["utc"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{far}"
        );
        assert_eq!(
            millis_json(Timestamp::from_millis(1_796_117_400_125))["utc"],
            "2026-12-01T09:30:00.125Z"
        );
    }

    #[tokio::test]
    async fn record_json_shows_state_and_response() {
        let store = MemoryStore::new();
        let scope = scope_for("k", None, Some("POST /x")).unwrap();
        let fp = Fingerprint::compute("POST", "POST /x", None, b"a", &Default::default());
        let Reservation::Acquired(lease) = store
            .reserve(&ReserveRequest::new(scope.clone(), fp))
            .await
            .unwrap()
        else {
            panic!("not acquired")
        };
        let now = SystemClock.now();
        let v = record_json(&store.get(&scope).await.unwrap().unwrap(), now);
        assert_eq!(v["record"]["state"], "in_progress");
        assert_eq!(v["attempt"], 1);
        store
            .complete(
                &lease,
                &StoredResponse::new(201, "made").with_header("location", "/x/1"),
            )
            .await
            .unwrap();
        let v = record_json(&store.get(&scope).await.unwrap().unwrap(), now);
        assert_eq!(v["record"]["state"], "completed");
        assert_eq!(v["record"]["response"]["status"], 201);
        assert_eq!(v["record"]["response"]["body"]["text"], "made");
        assert_eq!(v["record"]["response"]["headers"][0]["name"], "location");
        assert_eq!(
            v["record"]["response"]["reference"],
            serde_json::Value::Null
        );
        assert_eq!(v["endpoint"], "POST /x");
        // An answer recorded as a reference shows it apart from the headers.
        let referenced = Record {
            state: RecordState::Completed {
                response: StoredResponse::new(201, "")
                    .with_header("location", "/x/1")
                    .with_reference("/x/1?full=1"),
                completed_at: now,
            },
            ..store.get(&scope).await.unwrap().unwrap()
        };
        let v = record_json(&referenced, now);
        assert_eq!(v["record"]["response"]["reference"], "/x/1?full=1");
        let headers = v["record"]["response"]["headers"].as_array().unwrap();
        assert_eq!(headers.len(), 1);
        assert_eq!(v["fingerprint"], fp.to_hex());
    }
}
