//! [`Statements`]: every statement of a [`MySqlStore`](crate::MySqlStore), spelled once
//! for its table, and the record each row it reads holds.
//!
//! Parameters are MySQL's `?`, one per value in the order bound: a value a statement
//! needs twice is bound twice. A single-table `UPDATE` assigns its columns left to
//! right, each later one seeing the earlier ones' new values, so every assignment that
//! reads a column comes before the one that changes it.

use idem_core::{Record, Scope, StoreError};
use sqlx::mysql::MySqlRow;

use crate::error::store_error;
use crate::schema::{meta_table, rate_table};

/// The columns a record is read from.
pub(crate) const RECORD_COLUMNS: &str = "attempt, token, fingerprint, created_at, expires_at, \
     state, lease_until, status, headers, body, completed_at, tombstone_until, ambiguity";

/// The conditions under which a reserve takes an existing row (decide()'s `Execute`
/// rows and nothing else): the record expired, and is no completed record whose
/// tombstone outlives it; or it is in progress, its lease lapsed, and the payload is
/// the same. Parameters: now, now, now, the fingerprint.
const TAKES: &str = "((expires_at <= ? AND NOT (state = 'completed'
                                                AND COALESCE(tombstone_until, 0) > ?))
                      OR (state = 'in_progress' AND lease_until <= ? AND fingerprint = ?))";

/// Every statement, spelled once for the configured table. The table name was checked
/// as a plain identifier, so splicing it is safe; all values are bound parameters.
pub(crate) struct Statements {
    pub(crate) table: String,
    /// A fresh record: `id, tenant, endpoint, key, fingerprint, now, expires_at, token,
    /// lease_until`. Fails with a duplicate key (1062) where a row exists.
    pub(crate) insert: String,
    /// Takes an existing row over, if it is still the row the reserve read: `now ×4,
    /// expires_at of a fresh record, lease_until, fingerprint, token, lease_until, id`,
    /// the token, state and expires_at read, then [`TAKES`]' four.
    pub(crate) take_over: String,
    /// `status, headers, body, now, ambiguity, tombstone, ttl ×2, tombstone, ttl ×2,
    /// tombstone, ttl ×2, id, token, now` (the TTLs in ms, the tombstone's 0 for none).
    pub(crate) complete: String,
    /// Whether the lease completed the record already: `id, token, now`.
    pub(crate) completed_by: String,
    /// `lease_until ×2, id, token, now`.
    pub(crate) renew: String,
    /// `id, token, now`.
    pub(crate) release: String,
    /// The release of a reservation whose reply was lost, if it is a first attempt (a
    /// takeover's record lapses instead, so that the next attempt runs as a recovered
    /// one): `id, token, now`.
    pub(crate) release_unconfirmed: String,
    /// `reason, id, token, now`.
    pub(crate) mark: String,
    /// `id`.
    pub(crate) get: String,
    /// `id`.
    pub(crate) remove: String,
    /// Compacts completed records past their expiry into their tombstones: `now ×2,
    /// limit`.
    pub(crate) compact: String,
    /// Deletes expired records: `now ×2, limit`.
    pub(crate) purge: String,
    /// `name, value`; fails with a duplicate key where the secret exists.
    pub(crate) init_secret: String,
    /// `name`.
    pub(crate) secret: String,
    /// Takes a token from an existing bucket, refilled to now, where one is there:
    /// `burst, now, tokens a second, now, keep_until, bucket, burst, now, tokens a
    /// second`. Matches no row where the bucket is missing or empty.
    pub(crate) take_token: String,
    /// A new bucket, full less the token taken: `bucket, burst, now, keep_until`. Fails
    /// with a duplicate key (1062) where the bucket exists.
    pub(crate) new_bucket: String,
    /// Deletes full buckets: `now, limit`.
    pub(crate) purge_buckets: String,
}

/// The fenced match of a write on the lease's row: `id, token, now`.
const FENCED: &str = "id = ? AND token = ? AND expires_at > ? AND state = 'in_progress'";

impl Statements {
    pub(crate) fn for_table(t: &str) -> Statements {
        let insert = format!(
            "INSERT INTO {t} (id, tenant, endpoint, idem_key, fingerprint, created_at,
                              expires_at, attempt, token, state, lease_until)
             VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, 'in_progress', ?)"
        );
        // created_at and attempt read expires_at before it changes. The primary key is
        // forced: with expires_at among the fences, the optimizer may prefer its index,
        // whose range a locking read under REPEATABLE READ would lock with its gaps.
        let take_over = format!(
            "UPDATE {t} FORCE INDEX (PRIMARY) SET
                created_at  = CASE WHEN expires_at <= ? THEN ? ELSE created_at END,
                attempt     = CASE WHEN expires_at <= ? THEN 1
                                   ELSE LEAST(attempt, 2147483646) + 1 END,
                expires_at  = CASE WHEN expires_at <= ? THEN ?
                                   ELSE GREATEST(expires_at, ?) END,
                fingerprint = ?, token = ?, state = 'in_progress', lease_until = ?,
                status = NULL, headers = NULL, body = NULL, completed_at = NULL,
                tombstone_until = NULL, ambiguity = NULL
              WHERE id = ? AND token = ? AND state = ? AND expires_at = ? AND {TAKES}"
        );
        // A completed record expires at creation + TTL (`Lease::completed_expires_at`),
        // its tombstone that long after (`Lease::tombstone_until`, 0 for none); CASEs,
        // so that no sum overflows. tombstone_until reads expires_at before it changes.
        let expiry = "(CASE WHEN ? < expires_at - created_at THEN created_at + ?
                            ELSE expires_at END)";
        let complete = format!(
            "UPDATE {t} SET state = 'completed', lease_until = NULL, status = ?, headers = ?,
                    body = ?, completed_at = ?, ambiguity = ?,
                    tombstone_until = CASE WHEN ? = 0 THEN NULL
                                           WHEN {expiry} > 9223372036854775807 - ?
                                               THEN 9223372036854775807
                                           ELSE {expiry} + ? END,
                    expires_at = {expiry}
              WHERE {FENCED}"
        );
        let meta = meta_table(t);
        // A bucket's tokens now: what it held at at_ms, refilled at the rate since, up to
        // the burst. at_ms is assigned after tokens, which reads the old one.
        let rate = rate_table(t);
        let refilled = "LEAST(?, tokens + GREATEST(0, ? - at_ms) / 1000.0 * ?)";
        let take_token = format!(
            "UPDATE {rate} SET tokens = {refilled} - 1, at_ms = GREATEST(?, at_ms),
                    keep_until_ms = ?
              WHERE id = UNHEX(SHA2(?, 256)) AND {refilled} >= 1"
        );
        Statements {
            table: t.to_owned(),
            insert,
            take_over,
            complete,
            completed_by: format!(
                "SELECT 1 FROM {t}
                  WHERE id = ? AND token = ? AND expires_at > ? AND state = 'completed'"
            ),
            renew: format!(
                "UPDATE {t} SET lease_until = ?, expires_at = GREATEST(expires_at, ?)
                  WHERE {FENCED}"
            ),
            release: format!("DELETE FROM {t} WHERE {FENCED}"),
            release_unconfirmed: format!("DELETE FROM {t} WHERE {FENCED} AND attempt = 1"),
            mark: format!("UPDATE {t} SET ambiguity = ? WHERE {FENCED}"),
            get: format!("SELECT {RECORD_COLUMNS} FROM {t} WHERE id = ?"),
            remove: format!("DELETE FROM {t} WHERE id = ?"),
            // expires_at changes last: the WHERE chose the rows on the old values.
            compact: format!(
                "UPDATE {t} SET state = 'tombstone', headers = NULL, body = NULL,
                        ambiguity = NULL, expires_at = tombstone_until
                  WHERE expires_at <= ? AND state = 'completed' AND tombstone_until > ?
                  ORDER BY expires_at LIMIT ?"
            ),
            purge: format!(
                "DELETE FROM {t}
                  WHERE expires_at <= ?
                    AND NOT (state = 'completed' AND COALESCE(tombstone_until, 0) > ?)
                  ORDER BY expires_at LIMIT ?"
            ),
            init_secret: format!("INSERT INTO {meta} (name, value) VALUES (?, ?)"),
            secret: format!("SELECT value FROM {meta} WHERE name = ?"),
            take_token,
            new_bucket: format!(
                "INSERT INTO {rate} (id, tokens, at_ms, keep_until_ms)
                 VALUES (UNHEX(SHA2(?, 256)), ? - 1, ?, ?)"
            ),
            purge_buckets: format!(
                "DELETE FROM {rate} WHERE keep_until_ms < ? ORDER BY keep_until_ms LIMIT ?"
            ),
        }
    }
}

/// A value a fenced statement binds before the row's id.
pub(crate) enum Extra<'a> {
    Int(i64),
    Text(Option<&'a str>),
}

/// The scope's primary key: its [`Scope::digest`]'s 32 bytes.
pub(crate) fn row_id(scope: &Scope) -> Vec<u8> {
    hex::decode(scope.digest()).expect("a scope's digest is hex")
}

/// A record from the columns [`RECORD_COLUMNS`] names.
pub(crate) fn record_from_row(scope: &Scope, row: &MySqlRow) -> Result<Record, StoreError> {
    idem_sql::record_from_row(scope, row, store_error)
}

#[cfg(test)]
mod tests {
    use idem_core::testing::unique_namespace;
    use idem_test_support::service_unavailable;
    use idem_test_support::services::mysql_url;
    use sqlx::AssertSqlSafe;
    use sqlx::mysql::MySqlArguments;
    use sqlx::query::Query;

    use crate::{MySqlStore, SetupError, schema};

    /// The index each hot statement reads through, on a table of 20 000 rows of which
    /// 1 % expired: the reserve's takeover and read and the fenced writes by the primary
    /// key, the purge by `expires_at`; none scans the table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn statements_use_the_indexes() {
        let url = mysql_url();
        let table = format!("idem_records_{}", unique_namespace("plans"));
        let store = match MySqlStore::builder().table(&table).connect(&url).await {
            Ok(s) => s,
            Err(e @ SetupError::Unreachable { .. }) => {
                return service_unavailable("MySQL", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        let plans = explain_all(&store).await;
        schema::drop_table(store.pool(), &table)
            .await
            .expect("drop table");
        let expires = format!("{table}_expires");
        for (name, key, index) in plans.expect("explain") {
            let want = if name.starts_with("purge") || name == "compact" {
                expires.as_str()
            } else {
                "PRIMARY"
            };
            assert_eq!(key.as_deref(), Some(want), "{name} reads through {key:?}");
            assert_ne!(index, "ALL", "{name} scans the table");
        }
    }

    /// Each statement's name, the index its plan reads, and the plan's access type.
    async fn explain_all(
        store: &MySqlStore,
    ) -> Result<Vec<(&'static str, Option<String>, String)>, sqlx::Error> {
        let t = store.table();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (id, tenant, endpoint, idem_key, fingerprint, created_at,
                              expires_at, attempt, token, state, status, headers, body,
                              completed_at)
             WITH RECURSIVE n (i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 199)
             SELECT UNHEX(SHA2(i, 256)), 't', 'POST /v1/charges', CONCAT('key-', i),
                    UNHEX(SHA2(i, 256)), 0, IF(i % 100 = 0, 5, 10000), 1, i, 'completed',
                    200, '', 'ok', 0
               FROM (SELECT a.i * 100 + b.i + 1 AS i FROM n AS a JOIN n AS b
                      WHERE b.i < 100) AS s"
        )))
        .execute(&store.pool)
        .await?;
        sqlx::query(AssertSqlSafe(format!("ANALYZE TABLE {t}")))
            .execute(&store.pool)
            .await?;
        let sql = &store.sql;
        // A row that is there: the plan of a key that is not is "impossible WHERE".
        let id: Vec<u8> = sqlx::query_scalar(AssertSqlSafe(format!("SELECT id FROM {t} LIMIT 1")))
            .fetch_one(&store.pool)
            .await?;
        let explain = async |name: &'static str, q: Query<'_, sqlx::MySql, MySqlArguments>| {
            let rows = q.fetch_all(&store.pool).await?;
            let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
            let key: Option<String> = sqlx::Row::try_get(row, "key")?;
            let access: Option<String> = sqlx::Row::try_get(row, "type")?;
            Ok::<_, sqlx::Error>((name, key, access.unwrap_or_default()))
        };
        let text = |stmt: &str| format!("EXPLAIN {stmt}");
        let mut take_over = sqlx::query(AssertSqlSafe(text(&sql.take_over)));
        for _ in 0..6 {
            take_over = take_over.bind(100_i64);
        }
        let take_over = take_over
            .bind(vec![0_u8; 32])
            .bind(7_i64)
            .bind(160_i64)
            .bind(id.clone())
            .bind(7_i64)
            .bind("in_progress")
            .bind(100_i64)
            .bind(100_i64)
            .bind(100_i64)
            .bind(100_i64)
            .bind(vec![0_u8; 32]);
        let fenced = |stmt: &str| {
            sqlx::query(AssertSqlSafe(text(stmt)))
                .bind(id.clone())
                .bind(1_i64)
                .bind(100_i64)
        };
        let purge = |stmt: &str| {
            sqlx::query(AssertSqlSafe(text(stmt)))
                .bind(100_i64)
                .bind(100_i64)
                .bind(1000_i64)
        };
        Ok(vec![
            explain("take_over", take_over).await?,
            explain(
                "get",
                sqlx::query(AssertSqlSafe(text(&sql.get))).bind(id.clone()),
            )
            .await?,
            explain("release", fenced(&sql.release)).await?,
            explain(
                "renew",
                sqlx::query(AssertSqlSafe(text(&sql.renew)))
                    .bind(160_i64)
                    .bind(160_i64)
                    .bind(id.clone())
                    .bind(1_i64)
                    .bind(100_i64),
            )
            .await?,
            explain("compact", purge(&sql.compact)).await?,
            explain("purge", purge(&sql.purge)).await?,
        ])
    }
}
