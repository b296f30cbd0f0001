//! The purge on a Redis Cluster: the same `SCAN` and check as on one server
//! ([`Store::purge_expired`](idem_core::Store::purge_expired)), over each master in
//! turn, since a `SCAN` cursor belongs to one node.

use idem_core::{Result, Timestamp};

use crate::store::{PURGE, RedisStore, SCAN_COUNT, evalsha, scan_pattern};

impl RedisStore {
    /// Deletes up to `limit` records expired by `now`, resuming at the master and the
    /// cursor where the previous call stopped; ends at `limit` or once the last master
    /// has been scanned to its end.
    pub(crate) async fn purge_cluster(&self, limit: usize, now: Timestamp) -> Result<usize> {
        let masters = self.conn.masters().await.map_err(|e| self.failed(e))?;
        let pattern = scan_pattern(&self.prefix);
        let (mut node, mut cursor) = *self.node_cursor.lock().unwrap_or_else(|e| e.into_inner());
        let save = |at: (usize, u64)| {
            *self.node_cursor.lock().unwrap_or_else(|e| e.into_inner()) = at;
        };
        let mut purged = 0;
        while node < masters.len() {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let reply = self.conn.at_node(&masters[node], &scan).await;
            let (next, keys): (u64, Vec<Vec<u8>>) = reply
                .and_then(|v| Ok(redis::from_redis_value(v)?))
                .map_err(|e| self.failed(e))?;
            for key in keys {
                if purged == limit {
                    save((node, cursor));
                    return Ok(purged);
                }
                let mut cmd = evalsha(&PURGE, &key);
                cmd.arg(now.as_millis());
                let deleted: i64 = self.eval(&PURGE, &cmd).await?;
                purged += usize::from(deleted == 1);
            }
            cursor = next;
            if cursor == 0 {
                node += 1;
            }
            if purged == limit {
                break;
            }
        }
        // A pass ends at the last master: the next call starts again at the first.
        save(if node >= masters.len() {
            (0, 0)
        } else {
            (node, cursor)
        });
        Ok(purged)
    }
}
