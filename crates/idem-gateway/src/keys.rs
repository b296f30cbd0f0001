//! Key inspection and purge, shared by `idem keys show|purge` and the admin listener.

use std::process::ExitCode;

use idem_core::{
    Clock, Endpoint, Key, Record, RecordState, Scope, Store, SweeperConfig, SystemClock, Tenant,
    TenantKey, Timestamp, sweep_once,
};
use idem_tower::TenantHeaders;
use serde_json::{Value, json};

use crate::cli::{KeyTarget, KeysCommand, PurgeArgs, TenantArgs};
use crate::exit::Failure;
use crate::inspect::{millis_json, open};

/// Builds a record's scope from what an operator types.
///
/// `key` is parsed like the header (quoted or bare); `tenant` is the stored tenant name
/// (`anonymous` when absent); `endpoint` is `METHOD /route` (public scope mode) or absent
/// (internal mode).
pub fn scope_for(key: &str, tenant: Option<&str>, endpoint: Option<&str>) -> Result<Scope, String> {
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
pub fn record_json(record: &Record, now: Timestamp) -> Value {
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
pub async fn purge_expired(store: &dyn Store) -> usize {
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

/// The stored tenant an operator names: `--tenant` as stored, or the tenant the
/// gateway derives from the credentials in `--tenant-credential-env`'s variables, one
/// per tenant header, hashed under the same secret (the operator's, else the store's).
async fn tenant_of(
    tenant: Option<String>,
    args: &TenantArgs,
    store: &dyn Store,
) -> Result<Option<String>, String> {
    let Some(vars) = &args.tenant_credential_env else {
        return Ok(tenant);
    };
    let names = crate::config::parse_tenant_headers(
        &args
            .tenant_header
            .clone()
            .unwrap_or_else(|| vec!["authorization".to_owned()]),
    )
    .map_err(|e| e.to_string())?;
    if vars.len() != names.len() {
        let listed: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
        return Err(format!(
            "--tenant-credential-env names {} variables; give one per tenant header, in \
             order: {}",
            vars.len(),
            listed.join(", ")
        ));
    }
    let mut headers = http::HeaderMap::new();
    for (name, var) in names.iter().zip(vars) {
        let value = std::env::var_os(var)
            .ok_or_else(|| format!("environment variable {var} is not set"))?;
        let value = http::HeaderValue::from_bytes(value.as_encoded_bytes())
            .map_err(|_| format!("environment variable {var} holds no valid header value"))?;
        headers.insert(name.clone(), value);
    }
    let key = crate::config::tenant_key(
        args.tenant_secret.as_ref(),
        args.tenant_secret_file.as_deref(),
        None,
    )
    .map_err(|e| e.to_string())?;
    let key = match key {
        Some(key) => key,
        None => TenantKey::from_store(store)
            .await
            .map_err(|e| format!("cannot read the tenant secret from the store: {e}"))?,
    };
    let tenant = TenantHeaders::new(names).tenant(&key, &headers);
    Ok(Some(tenant.as_str().to_owned()))
}

/// Runs `idem keys …`; prints to standard output and returns the exit code.
pub async fn run(cmd: KeysCommand) -> ExitCode {
    match run_inner(cmd).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idem: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

async fn run_inner(cmd: KeysCommand) -> Result<ExitCode, Failure> {
    match cmd {
        KeysCommand::Show(KeyTarget {
            key,
            tenant,
            tenants,
            endpoint,
            store,
        }) => {
            let store = open(&store).await?;
            let scope = match tenant_of(tenant, &tenants, &*store).await {
                Ok(tenant) => scope_for(&key, tenant.as_deref(), endpoint.as_deref()),
                Err(e) => Err(e),
            };
            let result = match scope {
                Ok(scope) => show(&*store, &scope).await,
                Err(e) => Err(Failure::from(e)),
            };
            store.close().await;
            result
        }
        KeysCommand::List(args) => Ok(crate::listing::run(args).await),
        KeysCommand::Purge(PurgeArgs {
            key,
            expired,
            tenant,
            tenants,
            endpoint,
            store,
        }) => {
            let key = match (expired, key) {
                (true, _) => None,
                (false, Some(key)) => Some(key),
                (false, None) => return Err("give a KEY or --expired".into()),
            };
            let store = open(&store).await?;
            let scope = match key {
                None => Ok(None),
                Some(key) => match tenant_of(tenant, &tenants, &*store).await {
                    Ok(tenant) => scope_for(&key, tenant.as_deref(), endpoint.as_deref()).map(Some),
                    Err(e) => Err(e),
                },
            };
            let result = match scope {
                Ok(scope) => purge(&*store, scope.as_ref()).await,
                Err(e) => Err(Failure::from(e)),
            };
            store.close().await;
            result
        }
    }
}

/// `idem keys show`: prints the record of `scope`.
async fn show(store: &dyn Store, scope: &Scope) -> Result<ExitCode, Failure> {
    match store.get(scope).await.map_err(Failure::runtime)? {
        Some(record) => {
            let v = record_json(&record, SystemClock.now());
            println!("{}", serde_json::to_string_pretty(&v).expect("json"));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            eprintln!("idem: {}", not_found(scope));
            Ok(ExitCode::from(crate::exit::RUNTIME))
        }
    }
}

/// Why a scope may hold no record, and how the scope was made: a key is found only
/// under the tenant and (in public scope mode) the endpoint the gateway stored it with.
fn not_found(scope: &Scope) -> String {
    let endpoint = match scope.endpoint() {
        Some(endpoint) => format!("endpoint {}", endpoint.as_str()),
        None => "no endpoint, which is the scope of a gateway with --scope internal; under \
                 --scope public (the default) each key lives under its endpoint: give \
                 --endpoint 'POST /v1/charges', the route rule's template or the \
                 normalised path"
            .to_owned(),
    };
    format!(
        "no record for key {:?} in the scope tenant {}, {endpoint}. A scope is the \
         tenant (--tenant as stored, or --tenant-credential-env with the client's \
         credentials), the endpoint and the key; `idem keys list` shows the scopes that \
         hold records",
        scope.key().as_str(),
        scope.tenant().as_str(),
    )
}

/// `idem keys purge`: removes `scope`'s record, or with no scope every expired one.
async fn purge(store: &dyn Store, scope: Option<&Scope>) -> Result<ExitCode, Failure> {
    let Some(scope) = scope else {
        let n = purge_expired(store).await;
        println!("purged {n} expired records");
        return Ok(ExitCode::SUCCESS);
    };
    if store.remove(scope).await.map_err(Failure::runtime)? {
        println!("removed 1 record");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("idem: {}", not_found(scope));
        Ok(ExitCode::from(crate::exit::RUNTIME))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{
        Fingerprint, MemoryStore, Reservation, ReserveRequest, ScopeMode, StoredResponse,
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
