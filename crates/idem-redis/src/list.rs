//! [`Store::list`](idem_core::Store::list) for Redis: a `SCAN` of the prefix's record
//! keys, on one server or on each master of a cluster in turn (a `SCAN` cursor belongs
//! to one node), each record read and judged by [`ListQuery::matches`].
//!
//! The listing is the server's own `SCAN` iteration, never a part of one: every batch
//! one `SCAN` call returns is listed whole, across pages if it must be. A page that
//! fills in the middle of a batch carries the batch's unlisted record keys in its cursor
//! (as their 32-byte digests), and the next page lists them before it scans on; a batch
//! that would not fit in a page already holding records is left to the next page, which
//! asks for it again with the same `SCAN` cursor. So a listing makes exactly the `SCAN`
//! calls of one iteration, and inherits its guarantee: every record that exists for the
//! whole listing is listed, and, since `SCAN`'s reverse-binary cursor never revisits a
//! bucket while the table grows, listed once. Only a table that shrinks mid-listing (Redis
//! resizes it once under a tenth of it is used) may make `SCAN`, and so the listing,
//! return a record twice; it never hides one. Asking for no more keys per call than the
//! page has room for keeps the carried keys, and so the cursor, small.

use bytes::Bytes;
use idem_core::{ListCursor, ListPage, ListQuery, Record, Result, StoreError};

use crate::store::{RedisStore, SCAN_COUNT, decode, scan_pattern};

/// The most record keys one listing call reads before it returns the page it has, so
/// that a filter few records match still answers promptly: the next page goes on.
const LIST_READ_BUDGET: usize = 5 * SCAN_COUNT;

/// The most `SCAN` calls one listing call makes, so that a keyspace mostly of other
/// applications' keys, scanned a page's room at a time, still answers promptly.
const LIST_SCAN_BUDGET: usize = 256;

/// The fewest keys a listing asks one `SCAN` call for, however little room its page has
/// left (Redis's own default `COUNT`).
const MIN_SCAN_COUNT: usize = 10;

/// The length of a record key's digest, its hash tag, in bytes (64 hex digits).
const DIGEST_LEN: usize = 32;

/// Where a listing stands: the master (by its place among the sorted masters; 0 on one
/// server), the `SCAN` cursor to call next on it, and the digests of the record keys
/// of the previous batch that are still to be listed, first.
struct Position {
    node: usize,
    cursor: u64,
    pending: Vec<[u8; DIGEST_LEN]>,
}

impl Position {
    fn start() -> Position {
        Position {
            node: 0,
            cursor: 0,
            pending: Vec::new(),
        }
    }

    fn read(cursor: &ListCursor) -> Result<Position> {
        let invalid = || StoreError::InvalidCursor(cursor.as_str().to_owned());
        let [node, scan, pending]: [Vec<u8>; 3] =
            cursor.byte_parts(3)?.try_into().map_err(|_| invalid())?;
        let number = |part: Vec<u8>| {
            String::from_utf8(part)
                .ok()
                .and_then(|text| text.parse::<u64>().ok())
                .ok_or_else(invalid)
        };
        if !pending.len().is_multiple_of(DIGEST_LEN) {
            return Err(invalid());
        }
        Ok(Position {
            node: usize::try_from(number(node)?).map_err(|_| invalid())?,
            cursor: number(scan)?,
            pending: pending
                .chunks_exact(DIGEST_LEN)
                .map(|d| d.try_into().expect("exact chunks"))
                .collect(),
        })
    }

    fn cursor(&self) -> ListCursor {
        ListCursor::from_parts(&[
            self.node.to_string().into_bytes(),
            self.cursor.to_string().into_bytes(),
            self.pending.concat(),
        ])
    }
}

impl RedisStore {
    /// One page: first the keys the previous page left of its last batch, then whole
    /// `SCAN` batches, until the page is full, a budget spent, or the last node scanned
    /// to its end.
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
        if at.node > nodes.len() || (at.node == nodes.len() && at.pending.is_empty()) {
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
        let (mut read, mut scans) = (0, 0);
        let mut pending = std::mem::take(&mut at.pending).into_iter();
        let mut listed = std::collections::HashSet::new();
        loop {
            // What is left of the last batch, in order; the page may fill first.
            while records.len() < limit {
                let Some(digest) = pending.next() else { break };
                if !listed.insert(digest) {
                    // Already on this page: a batch after a shrink repeated it.
                    continue;
                }
                read += 1;
                if let Some(record) = self.read_key(self.key_of(&digest).as_bytes()).await?
                    && query.matches(&record, now)
                {
                    records.push(record);
                }
            }
            at.pending = pending.collect();
            let done = at.node == nodes.len() && at.pending.is_empty();
            if done {
                return Ok(ListPage {
                    records,
                    next: None,
                });
            }
            let room = limit - records.len();
            if room == 0 || read >= LIST_READ_BUDGET || scans >= LIST_SCAN_BUDGET {
                return Ok(ListPage {
                    records,
                    next: Some(at.cursor()),
                });
            }
            let mut scan = redis::cmd("SCAN");
            scan.arg(at.cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(room.clamp(MIN_SCAN_COUNT, SCAN_COUNT));
            scans += 1;
            let reply = self.conn.at_node(&nodes[at.node], &scan).await;
            let (next, keys): (u64, Vec<Vec<u8>>) = reply
                .and_then(|v| Ok(redis::from_redis_value(v)?))
                .map_err(|e| self.failed(e))?;
            let mut batch: Vec<[u8; DIGEST_LEN]> =
                keys.iter().filter_map(|k| self.digest_of(k)).collect();
            batch.sort_unstable();
            batch.dedup();
            if batch.len() > room && !records.is_empty() {
                // It may not fit: the next page calls `SCAN` at this cursor again, and
                // nothing of this batch has been listed.
                return Ok(ListPage {
                    records,
                    next: Some(at.cursor()),
                });
            }
            at.cursor = next;
            if next == 0 {
                at.node += 1;
            }
            pending = batch.into_iter();
        }
    }

    /// The digest of `key` if it is a record key of this store (a tombstone key, which
    /// the pattern matches too, is never listed); `None` for anything else.
    fn digest_of(&self, key: &[u8]) -> Option<[u8; DIGEST_LEN]> {
        let tag = key
            .strip_prefix(self.prefix.as_bytes())?
            .strip_prefix(b"{")?
            .strip_suffix(b"}")?;
        // The store writes lowercase digests only; another spelling is no key of ours.
        if !tag.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let mut digest = [0; DIGEST_LEN];
        hex::decode_to_slice(tag, &mut digest).ok()?;
        Some(digest)
    }

    /// The record key whose hash tag is `digest`.
    fn key_of(&self, digest: &[u8; DIGEST_LEN]) -> String {
        format!("{}{{{}}}", self.prefix, hex::encode(digest))
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
