//! [`Store::list`](idem_core::Store::list) for Redis: a `SCAN` of the prefix's record
//! keys, on one server or on each master of a cluster in turn (a `SCAN` cursor belongs
//! to one node), each record read and judged by [`ListQuery::matches`].

use bytes::Bytes;
use idem_core::{ListCursor, ListPage, ListQuery, Record, Result, StoreError};

use crate::store::{RedisStore, SCAN_COUNT, decode, scan_pattern};

/// The most record keys one listing call reads before it returns the page it has, so
/// that a filter few records match still answers promptly: the next page goes on.
const LIST_SCAN_BUDGET: usize = 5 * SCAN_COUNT;

/// Where a listing stands: the master (by its place among the sorted masters; 0 on one
/// server), its `SCAN` cursor, and the last key of that cursor's batch already listed
/// (empty for none). A batch is read in key order, so resuming in the middle of one
/// scans it again and skips to after that key.
struct Position {
    node: usize,
    cursor: u64,
    after_key: Vec<u8>,
}

impl Position {
    fn start() -> Position {
        Position {
            node: 0,
            cursor: 0,
            after_key: Vec::new(),
        }
    }

    fn read(cursor: &ListCursor) -> Result<Position> {
        let invalid = || StoreError::InvalidCursor(cursor.as_str().to_owned());
        let [node, scan, after_key]: [String; 3] =
            cursor.parts(3)?.try_into().map_err(|_| invalid())?;
        Ok(Position {
            node: node.parse().map_err(|_| invalid())?,
            cursor: scan.parse().map_err(|_| invalid())?,
            after_key: after_key.into_bytes(),
        })
    }

    fn cursor(&self) -> ListCursor {
        ListCursor::from_parts(&[
            self.node.to_string().as_bytes(),
            self.cursor.to_string().as_bytes(),
            &self.after_key,
        ])
    }
}

impl RedisStore {
    /// One page: whole `SCAN` batches read in key order, until the page is full, the
    /// budget spent, or the last node scanned to its end.
    pub(crate) async fn list_page(&self, query: &ListQuery) -> Result<ListPage> {
        let now = self.clock.now();
        let limit = query.limit();
        let mut at = match &query.after {
            Some(cursor) => Position::read(cursor)?,
            None => Position::start(),
        };
        let nodes = if self.conn.is_cluster() {
            self.conn.masters().await.map_err(|e| self.failed(e))?
        } else {
            // One server: `at_node` sends to it whatever the address.
            vec![(String::new(), 0)]
        };
        if at.node > nodes.len() {
            return Err(StoreError::InvalidCursor(
                query
                    .after
                    .as_ref()
                    .map(|c| c.as_str().to_owned())
                    .unwrap_or_default(),
            ));
        }
        let pattern = scan_pattern(&self.prefix);
        let mut records: Vec<Record> = Vec::new();
        let mut read = 0;
        while at.node < nodes.len() {
            let mut scan = redis::cmd("SCAN");
            scan.arg(at.cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let reply = self.conn.at_node(&nodes[at.node], &scan).await;
            let (next, mut keys): (u64, Vec<Vec<u8>>) = reply
                .and_then(|v| Ok(redis::from_redis_value(v)?))
                .map_err(|e| self.failed(e))?;
            keys.sort_unstable();
            keys.dedup();
            for key in keys.into_iter().filter(|k| *k > at.after_key) {
                read += 1;
                if let Some(record) = self.read_key(&key).await?
                    && query.matches(&record, now)
                {
                    records.push(record);
                }
                if records.len() == limit {
                    at.after_key = key;
                    return Ok(ListPage {
                        records,
                        next: Some(at.cursor()),
                    });
                }
            }
            at.after_key.clear();
            at.cursor = next;
            if next == 0 {
                at.node += 1;
            }
            if read >= LIST_SCAN_BUDGET && at.node < nodes.len() {
                return Ok(ListPage {
                    records,
                    next: Some(at.cursor()),
                });
            }
        }
        Ok(ListPage {
            records,
            next: None,
        })
    }

    /// The record at `key`, `None` when it went (expired natively, say) since the scan.
    async fn read_key(&self, key: &[u8]) -> Result<Option<Record>> {
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.failed(e))?;
        value
            .map(|v| decode(&String::from_utf8_lossy(key), Bytes::from(v)))
            .transpose()
    }
}
