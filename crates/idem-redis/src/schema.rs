//! The namespace's marker: how a Redis store tells "never opened by idem" from "no
//! records now".
//!
//! Records expire natively, so an empty prefix is what both a namespace whose records
//! have all expired and a mistyped one look like. A SQL store has its table to tell
//! them apart; this store has one small key, [`RedisStore::marker_key`]
//! (`PREFIX` + `meta:schema`), holding [`SCHEMA_VERSION`] as decimal text, without
//! TTL. Connecting writes it where it is missing (`SET … NX GET`, one round trip, which
//! also answers what was there); opening for inspection
//! ([`Schema::Existing`](idem_core::Schema::Existing)) only reads it, and a namespace
//! without it is [`SetupError::NoSchema`].
//!
//! It is one key, read and written alone, so on a Redis Cluster it lives on its own
//! slot's master like any key and never takes part in a command on two keys (which
//! would be refused across slots); it has no hash tag of a record's form, so the
//! `SCAN` of listing and purge never matches it.
//!
//! A namespace served only by gateways from before the marker has none until one of
//! this version connects; where such a gateway kept its tenant secret in the store
//! ([`RedisStore::secret_key`]), that key counts as the marker, so inspecting it is not
//! refused meanwhile.

use idem_core::{SetupError, TENANT_SECRET_NAME};
use redis::RedisResult;

use crate::RedisStore;
use crate::error::{KIND, setup_error};

/// The version of this store's layout (the record format of the crate docs) that the
/// marker records. A namespace marked with a later one was opened by a newer build,
/// whose records this one may not read.
pub const SCHEMA_VERSION: u32 = 1;

/// What follows the prefix in the marker's key.
const MARKER: &str = "meta:schema";

impl RedisStore {
    /// The Redis key of the namespace's marker: the prefix and `meta:schema`, holding
    /// the [`SCHEMA_VERSION`] of the build that first connected, without TTL. Its being
    /// there is what tells a namespace a gateway opened (even one with no records left)
    /// from one it never did.
    pub fn marker_key(&self) -> String {
        format!("{}{MARKER}", self.prefix)
    }

    /// Writes the marker unless it is there; the version already there, if any.
    pub(crate) async fn mark_namespace(&self) -> RedisResult<Option<String>> {
        redis::cmd("SET")
            .arg(self.marker_key())
            .arg(SCHEMA_VERSION)
            .arg("NX")
            .arg("GET")
            .query_async(&mut self.conn.clone())
            .await
    }

    /// Reads the marker, writing nothing; `None` when neither it nor an older
    /// gateway's tenant secret is there.
    async fn read_marker(&self) -> RedisResult<Option<String>> {
        let mut conn = self.conn.clone();
        let marker: Option<String> = redis::cmd("GET")
            .arg(self.marker_key())
            .query_async(&mut conn)
            .await?;
        if marker.is_some() {
            return Ok(marker);
        }
        // Two keys, two commands: on a cluster they are on different slots.
        let secret: bool = redis::cmd("EXISTS")
            .arg(self.secret_key(TENANT_SECRET_NAME))
            .query_async(&mut conn)
            .await?;
        Ok(secret.then(|| "1".to_owned()))
    }

    /// Checks, writing nothing, that a gateway opened this namespace with a layout
    /// this build reads: none is [`SetupError::NoSchema`], a later one
    /// [`SetupError::SchemaVersion`].
    pub(crate) async fn check_marker(&self) -> Result<(), SetupError> {
        let Some(found) = self.read_marker().await.map_err(setup_error)? else {
            return Err(SetupError::NoSchema {
                kind: KIND,
                missing: format!("no key {}", self.marker_key()),
                migrate: false,
            });
        };
        self.check_version(&found)
    }

    /// Refuses a namespace marked by a build whose layout is later than this one's, or
    /// whose marker is not a version at all.
    pub(crate) fn check_version(&self, found: &str) -> Result<(), SetupError> {
        match found.trim().parse::<u32>() {
            Ok(version) if version <= SCHEMA_VERSION => Ok(()),
            Ok(version) => Err(SetupError::SchemaVersion {
                kind: KIND,
                at: format!("key {}", self.marker_key()),
                found: version.into(),
                supported: SCHEMA_VERSION.into(),
            }),
            Err(_) => Err(SetupError::failed(
                KIND,
                format!(
                    "{} holds {found:?}, which is no schema version: it is this store's \
                     marker, and something else wrote it",
                    self.marker_key()
                ),
            )),
        }
    }
}
