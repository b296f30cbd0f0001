//! What the operators' commands (`idem keys show|purge|list`) share: the store as they
//! open it, read-only in its schema, and instants as JSON.

use idem_core::{Store, Timestamp};
use serde_json::{Value, json};

use crate::cli::StoreArgs;
use crate::exit::Failure;

/// An instant as JSON for operators: its milliseconds and its RFC 3339 text.
pub(crate) fn millis_json(t: Timestamp) -> Value {
    json!({ "unix_ms": t.as_millis(), "utc": t.to_rfc3339() })
}

/// Opens the store `idem keys` names (refusing a `memory://` one, which would be new
/// and empty here).
pub(crate) async fn open(store: &StoreArgs) -> Result<std::sync::Arc<dyn Store>, Failure> {
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
