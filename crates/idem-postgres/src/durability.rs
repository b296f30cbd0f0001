//! [`DurabilityRisk`]: the server settings under which PostgreSQL may lose what it
//! acknowledged, read when the store connects.

use sqlx::PgPool;

/// Server settings under which PostgreSQL can lose records it acknowledged:
/// `synchronous_commit = off` answers a commit before its WAL reaches the disk, so a
/// server crash forgets the last fraction of a second of records (a retry of one of
/// those keys executes again); `fsync = off` may lose or corrupt anything written
/// since the last checkpoint when the machine crashes or loses power.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurabilityRisk {
    /// The store's sessions run with `synchronous_commit = off`.
    pub synchronous_commit_off: bool,
    /// The server runs with `fsync = off`.
    pub fsync_off: bool,
}

impl DurabilityRisk {
    /// The risk the two settings make, if any.
    fn from_settings(fsync: &str, synchronous_commit: &str) -> Option<DurabilityRisk> {
        let risk = DurabilityRisk {
            synchronous_commit_off: synchronous_commit.eq_ignore_ascii_case("off"),
            fsync_off: fsync.eq_ignore_ascii_case("off"),
        };
        (risk.synchronous_commit_off || risk.fsync_off).then_some(risk)
    }
}

/// Reads, on a connection of the store's pool (so with the URL's session options), the
/// settings that decide whether an acknowledged commit survives a crash, and warns when
/// it may not. A server that cannot be asked is not checked.
pub(crate) async fn durability_risk(pool: &PgPool) -> Option<DurabilityRisk> {
    let settings: Result<(String, String), sqlx::Error> =
        sqlx::query_as("SELECT current_setting('fsync'), current_setting('synchronous_commit')")
            .fetch_one(pool)
            .await;
    let (fsync, synchronous_commit) = match settings {
        Ok(settings) => settings,
        Err(e) => {
            tracing::debug!(error = %e, "could not read the PostgreSQL server's durability settings");
            return None;
        }
    };
    let risk = DurabilityRisk::from_settings(&fsync, &synchronous_commit)?;
    if risk.fsync_off {
        tracing::warn!(
            "PostgreSQL runs with fsync = off: a machine crash or power loss can lose or \
             corrupt idempotency records, and a retry of a lost key executes again"
        );
    }
    if risk.synchronous_commit_off {
        tracing::warn!(
            "the idempotency store's PostgreSQL sessions run with synchronous_commit = off: \
             a server crash can forget the last records written, and a retry of one of \
             those keys executes again"
        );
    }
    Some(risk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_setting_off_is_a_risk() {
        assert_eq!(DurabilityRisk::from_settings("on", "on"), None);
        // Other synchronous_commit levels still wait for the local flush.
        assert_eq!(DurabilityRisk::from_settings("on", "local"), None);
        assert_eq!(DurabilityRisk::from_settings("on", "remote_write"), None);
        assert_eq!(
            DurabilityRisk::from_settings("on", "off"),
            Some(DurabilityRisk {
                synchronous_commit_off: true,
                fsync_off: false
            })
        );
        assert_eq!(
            DurabilityRisk::from_settings("off", "on"),
            Some(DurabilityRisk {
                synchronous_commit_off: false,
                fsync_off: true
            })
        );
    }
}
