//! `idem keys show|purge|list`: one key's record shown or deleted, expired records
//! purged, records listed, from the store itself (the admin listener's `/keys` routes
//! do the same through a running gateway).

use std::process::ExitCode;

use idem_core::{Clock, Scope, Store, SystemClock, TenantKey};
use idem_tower::TenantHeaders;

use crate::cli::{KeyTarget, KeysCommand, PurgeArgs, StoreArgs, TenantArgs};
use crate::exit::Failure;
use crate::inspect::{purge_expired, record_json, scope_for};

mod list;

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
pub(crate) async fn run(cmd: KeysCommand) -> ExitCode {
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
        KeysCommand::List(args) => list::run(args).await,
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

/// Opens the store `idem keys` names (refusing a `memory://` one, which would be new
/// and empty here).
async fn open(store: &StoreArgs) -> Result<std::sync::Arc<dyn Store>, Failure> {
    let url = store.url();
    refuse_memory(url)?;
    // Inspection never writes a schema: a mistyped file or namespace is said to hold
    // nothing of idem's, rather than made into an empty store.
    let options = crate::store::StoreOptions {
        namespace: store.namespace().map_err(|e| e.to_string())?,
        schema: idem_core::Schema::Existing,
        ..Default::default()
    };
    crate::store::open_with(url, options)
        .await
        .map_err(|e| Failure::open(&e))
}

/// A memory store lives in the process that made it: opened here it would be a new,
/// empty one, and every key would be "no record".
fn refuse_memory(url: &str) -> Result<(), String> {
    match crate::store::kind(url) {
        Some("memory") => Err(
            "a memory:// store lives inside the `idem serve` that holds it, so this command \
             would read a new, empty one; ask that gateway's admin listener instead \
             (GET or DELETE /keys?key=…, GET /keys?ambiguous=true, POST /keys/purge-expired)"
                .into(),
        ),
        // Anything else, good or bad, is for opening to judge.
        _ => Ok(()),
    }
}
