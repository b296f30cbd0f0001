//! [`Statements`]: every statement of a [`PgStore`](crate::PgStore), spelled once for
//! its table, and the record each row it reads holds.

use std::sync::Arc;

use idem_core::{Record, Scope, StoreError};
use idem_sql::SqlDatabase;
use sqlx::Postgres;
use sqlx::postgres::PgRow;

use crate::error::store_error;

/// An answer as its row keeps it: the status, the header block
/// (`idem_core::codec::encode_response_headers` without the ambiguity), the body, and
/// the `ambiguity` column.
#[derive(Clone, Copy)]
pub(crate) struct RowAnswer<'a> {
    pub(crate) status: i32,
    pub(crate) headers: &'a [u8],
    pub(crate) body: &'a [u8],
    pub(crate) ambiguity: Option<&'a str>,
}

/// A record from the columns every query below selects.
pub(crate) fn record_from_row(scope: &Scope, row: &PgRow) -> Result<Record, StoreError> {
    idem_sql::record_from_row(scope, row, store_error)
}

/// Every statement, spelled once for the configured table. The table name was validated
/// as a plain identifier, so splicing it is safe; all values are bound parameters.
pub(crate) struct Statements {
    pub(crate) table: String,
    pub(crate) reserve: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) completed_by: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) mark: Arc<str>,
    pub(crate) release_unconfirmed: Arc<str>,
    pub(crate) get: Arc<str>,
    pub(crate) remove: Arc<str>,
    pub(crate) purge: Arc<str>,
    /// Takes a token from a tenant's rate bucket (`TABLE_rate`, migration 5).
    pub(crate) take_token: Arc<str>,
    /// Deletes full rate buckets.
    pub(crate) purge_buckets: Arc<str>,
    /// Stores a secret under a name no secret holds yet (`TABLE_meta`, migration 2).
    pub(crate) init_secret: Arc<str>,
    /// Reads a secret.
    pub(crate) secret: Arc<str>,
}

/// The columns a record is read from, in the order both halves of `reserve` return them.
pub(crate) const RECORD_COLUMNS: &str = "attempt, token, fingerprint, created_at, expires_at, state, \
                              lease_until, status, headers, body, completed_at, tombstone_until, ambiguity";

/// The `ON CONFLICT` clause of a reserve, the single-row one and the batched one
/// alike: its `WHERE` is decide()'s Execute rows and nothing else (see
/// [`Statements::for_table`]), with `now` the parameter holding the current time.
pub(crate) fn reserve_takes(now: &str) -> String {
    format!(
        "ON CONFLICT (tenant, endpoint, idem_key) DO UPDATE SET
                    fingerprint  = EXCLUDED.fingerprint,
                    created_at   = CASE WHEN r.expires_at <= {now} THEN EXCLUDED.created_at
                                        ELSE r.created_at END,
                    expires_at   = CASE WHEN r.expires_at <= {now} THEN EXCLUDED.expires_at
                                        ELSE GREATEST(r.expires_at, EXCLUDED.lease_until) END,
                    attempt      = CASE WHEN r.expires_at <= {now} THEN 1
                                        ELSE LEAST(r.attempt, 2147483646) + 1 END,
                    token        = EXCLUDED.token,
                    state        = 'in_progress',
                    lease_until  = EXCLUDED.lease_until,
                    status       = NULL,
                    headers      = NULL,
                    body         = NULL,
                    completed_at = NULL,
                    tombstone_until = NULL,
                    ambiguity    = NULL
                WHERE (r.expires_at <= {now}
                       AND NOT (r.state = 'completed' AND COALESCE(r.tombstone_until, 0) > {now}))
                   OR (r.state = 'in_progress' AND r.lease_until <= {now}
                       AND r.fingerprint = EXCLUDED.fingerprint)"
    )
}

/// The expiry and tombstone end (SPEC S16) of a record completed now, as `SET`
/// assignments over the old row `r`, with `ttl` and `tombstone` the parameters holding
/// the TTL and the tombstone TTL in ms (0 for none): as `Lease::completed_expires_at`
/// and `Lease::tombstone_until` say. CASEs, so that no sum overflows.
pub(crate) fn completed_expiry(r: &str, ttl: &str, tombstone: &str) -> String {
    let expiry = format!(
        "(CASE WHEN {ttl} < {r}.expires_at - {r}.created_at THEN {r}.created_at + {ttl}
               ELSE {r}.expires_at END)"
    );
    format!(
        "expires_at = {expiry},
         tombstone_until = CASE WHEN {tombstone} = 0 THEN NULL
                                WHEN {expiry} > 9223372036854775807 - {tombstone}
                                    THEN 9223372036854775807
                                ELSE {expiry} + {tombstone} END"
    )
}

/// The scope's primary key, as parameters $1..$3.
const BY_SCOPE: &str = "tenant = $1 AND endpoint = $2 AND idem_key = $3";

impl Statements {
    pub(crate) fn for_table(t: &str) -> Statements {
        // reserve: $1 tenant, $2 endpoint, $3 key, $4 fingerprint, $5 now, $6 expires_at
        // of a fresh record, $7 the new token, $8 lease_until.
        //
        // The DO UPDATE's WHERE is decide()'s Execute rows and nothing else: the record
        // expired (any payload: start afresh as attempt 1, new creation time and
        // expiry), or it is in progress, its lease lapsed, and the payload is the same
        // (take over as attempt n+1, keeping the creation time; expiry never before the
        // new lease ends). When the insert took nothing, the second half reads the row.
        let take = reserve_takes("$5");
        let reserve = format!(
            "WITH ins AS (
                INSERT INTO {t} AS r (tenant, endpoint, idem_key, fingerprint, created_at,
                                      expires_at, attempt, token, state, lease_until)
                VALUES ($1, $2, $3, $4, $5::BIGINT, $6::BIGINT, 1, $7::BIGINT,
                        'in_progress', $8::BIGINT)
                {take}
                RETURNING {RECORD_COLUMNS}
            )
            SELECT TRUE AS acquired, {RECORD_COLUMNS} FROM ins
            UNION ALL
            SELECT FALSE AS acquired, {RECORD_COLUMNS} FROM {t}
             WHERE {BY_SCOPE} AND NOT EXISTS (SELECT 1 FROM ins)"
        );
        // complete: $4 token, $5 now, $6 status, $7 headers, $8 body, $9 the TTL in ms,
        // $10 the tombstone TTL in ms, $11 the answer's ambiguity or NULL. A completed record expires at creation + TTL, as
        // `Lease::completed_expires_at` says: the lease may have kept it alive longer
        // while in progress.
        let expiry = completed_expiry("r", "$9::BIGINT", "$10::BIGINT");
        let complete = format!(
            "UPDATE {t} AS r SET state = 'completed', lease_until = NULL, status = $6,
                    headers = $7, body = $8, completed_at = $5, ambiguity = $11, {expiry}
              WHERE {BY_SCOPE} AND token = $4 AND expires_at > $5 AND state = 'in_progress'"
        );
        let completed_by = format!(
            "SELECT 1 FROM {t}
              WHERE {BY_SCOPE} AND token = $4 AND expires_at > $5 AND state = 'completed'"
        );
        // renew: $5 now, $6 the new lease_until.
        let renew = format!(
            "UPDATE {t} SET lease_until = $6, expires_at = GREATEST(expires_at, $6)
              WHERE {BY_SCOPE} AND token = $4 AND expires_at > $5 AND state = 'in_progress'"
        );
        let release = format!(
            "DELETE FROM {t}
              WHERE {BY_SCOPE} AND token = $4 AND expires_at > $5 AND state = 'in_progress'"
        );
        // A reservation whose reply was lost, if it is a first attempt: a takeover's
        // record must lapse instead, so that the next attempt runs as a recovered one.
        let release_unconfirmed = format!("{release} AND attempt = 1");
        // mark: $6 the reason an attempt leaves its record in progress.
        let mark = format!(
            "UPDATE {t} SET ambiguity = $6
              WHERE {BY_SCOPE} AND token = $4 AND expires_at > $5 AND state = 'in_progress'"
        );
        let get = format!("SELECT {RECORD_COLUMNS} FROM {t} WHERE {BY_SCOPE}");
        let remove = format!("DELETE FROM {t} WHERE {BY_SCOPE}");
        // At most $2 rows of each kind, found through the expires_at index; rows
        // another transaction holds (a reserve taking one over) are skipped, not waited
        // for. A completed record whose tombstone outlives it is compacted into the
        // tombstone, which the index then finds at its own end (SPEC S16); the rest
        // are deleted. Both halves see the same snapshot, and their rows are disjoint.
        let skip_locked = Postgres::SKIP_LOCKED;
        let purge = format!(
            "WITH compacted AS (
                UPDATE {t} SET state = 'tombstone', headers = NULL, body = NULL,
                       ambiguity = NULL, expires_at = tombstone_until
                 WHERE ctid = ANY(ARRAY(
                           SELECT ctid FROM {t} WHERE expires_at <= $1
                              AND state = 'completed' AND tombstone_until > $1
                            ORDER BY expires_at LIMIT $2{skip_locked}))
                   AND expires_at <= $1 AND state = 'completed'
                RETURNING 1
            ), deleted AS (
                DELETE FROM {t}
                 WHERE ctid = ANY(ARRAY(
                           SELECT ctid FROM {t} WHERE expires_at <= $1
                              AND NOT (state = 'completed' AND COALESCE(tombstone_until, 0) > $1)
                            ORDER BY expires_at LIMIT $2{skip_locked}))
                   AND expires_at <= $1
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM compacted) + (SELECT count(*) FROM deleted)"
        );
        // An insert of a full bucket less one token, or an update that refills the
        // bucket and takes a token only where one is there: no row comes back when
        // none is. $2 the burst, $3 tokens a second, $4 now, $5 when it is full again.
        let rate = crate::schema::rate_table(t);
        let refilled = "LEAST($2, r.tokens + GREATEST(0, $4 - r.at_ms) / 1000.0 * $3)";
        let take_token = format!(
            "INSERT INTO {rate} AS r (bucket, tokens, at_ms, keep_until_ms)
             VALUES ($1, $2 - 1, $4, $5)
             ON CONFLICT (bucket) DO UPDATE SET
                 tokens = {refilled} - 1,
                 at_ms = GREATEST($4, r.at_ms),
                 keep_until_ms = $5
             WHERE {refilled} >= 1
             RETURNING 1"
        );
        let purge_buckets = Postgres::delete_limited(&rate, "bucket", "keep_until_ms < $1", "$2");
        // $1 the name, $2 the candidate value.
        let meta = crate::schema::meta_table(t);
        let init_secret = Postgres::insert_if_absent(
            &format!("INSERT INTO {meta} (name, value) VALUES ($1, $2)"),
            "name",
        );
        Statements {
            table: t.to_owned(),
            take_token: take_token.into(),
            purge_buckets: purge_buckets.into(),
            init_secret: init_secret.into(),
            secret: format!("SELECT value FROM {meta} WHERE name = $1").into(),
            reserve: reserve.into(),
            complete: complete.into(),
            completed_by: completed_by.into(),
            renew: renew.into(),
            release: release.into(),
            mark: mark.into(),
            release_unconfirmed: release_unconfirmed.into(),
            get: get.into(),
            remove: remove.into(),
            purge: purge.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use idem_core::testing::unique_namespace;
    use idem_test_support::{service_unavailable, service_url};
    use sqlx::AssertSqlSafe;

    use crate::{PgStore, SetupError, schema};

    use super::*;

    /// The plans PostgreSQL picks for the hot statements on a table of realistic size:
    /// the reserve's read and the fenced writes go through the primary key, the purge
    /// through the `expires_at` index; none scans the table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn statements_use_the_indexes() {
        let url = service_url(
            "IDEM_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        let table = format!("idem_records_{}", unique_namespace("plans"));
        let store = match PgStore::builder().table(&table).connect(&url).await {
            Ok(s) => s,
            Err(e @ SetupError::Unreachable { .. }) => {
                return service_unavailable("PostgreSQL", &url, &e).unwrap_or(());
            }
            Err(e) => panic!("{e}"),
        };
        let plans = explain_all(&store).await;
        schema::drop_table(store.pool(), &table)
            .await
            .expect("drop table");
        let plans = plans.expect("explain");
        for (name, plan) in &plans {
            eprintln!("{name}:\n{plan}\n");
            assert!(
                !plan.contains("Seq Scan"),
                "{name} scans the table:\n{plan}"
            );
        }
        let uses = |name: &str, index: &str| {
            let plan = &plans.iter().find(|(n, _)| *n == name).expect(name).1;
            assert!(
                plan.contains(&format!("{table}_{index}")),
                "{name} does not use {index}:\n{plan}"
            );
        };
        uses("reserve", "pkey");
        uses("complete", "pkey");
        uses("renew", "pkey");
        uses("release", "pkey");
        uses("release_unconfirmed", "pkey");
        uses("purge", "expires");
    }

    async fn explain_all(store: &PgStore) -> Result<Vec<(&'static str, String)>, sqlx::Error> {
        let t = store.table();
        // 100,000 rows, 1 % of them expired at `now`.
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (tenant, endpoint, idem_key, fingerprint, created_at, expires_at,
                              attempt, token, state, status, headers, body, completed_at)
             SELECT 'tenant-' || (i % 97), 'POST /v1/charges', 'key-' || i,
                    sha256(i::text::bytea), 0, CASE WHEN i % 100 = 0 THEN 5 ELSE 10000 END,
                    1, i, 'completed', 200, '\\x0000'::bytea, 'ok'::bytea, 0
               FROM generate_series(1, 100000) AS i"
        )))
        .execute(&store.pool)
        .await?;
        sqlx::query(AssertSqlSafe(format!("ANALYZE {t}")))
            .execute(&store.pool)
            .await?;
        let sql = &store.sql;
        // For the statements whose parameters are the scope (when `scoped`) and then
        // numbers.
        let explain =
            async |stmt: &Arc<str>, scoped: bool, binds: &[i64]| -> Result<String, sqlx::Error> {
                let text = format!("EXPLAIN {stmt}");
                let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(text));
                if scoped {
                    q = q.bind("tenant-1").bind("POST /v1/charges").bind("key-1");
                }
                for b in binds {
                    q = q.bind(*b);
                }
                Ok(q.fetch_all(&store.pool).await?.join("\n"))
            };
        let reserve = {
            let text = format!("EXPLAIN {}", sql.reserve);
            sqlx::query_scalar::<_, String>(AssertSqlSafe(text))
                .bind("tenant-1")
                .bind("POST /v1/charges")
                .bind("key-1")
                .bind(vec![0_u8; 32])
                .bind(100_i64)
                .bind(200_i64)
                .bind(7_i64)
                .bind(160_i64)
                .fetch_all(&store.pool)
                .await?
                .join("\n")
        };
        let complete = {
            let text = format!("EXPLAIN {}", sql.complete);
            sqlx::query_scalar::<_, String>(AssertSqlSafe(text))
                .bind("tenant-1")
                .bind("POST /v1/charges")
                .bind("key-1")
                .bind(1_i64)
                .bind(100_i64)
                .bind(200_i32)
                .bind(vec![0_u8, 0])
                .bind(vec![1_u8])
                .bind(86_400_000_i64)
                .bind(0_i64)
                .bind(None::<&str>)
                .fetch_all(&store.pool)
                .await?
                .join("\n")
        };
        Ok(vec![
            ("reserve", reserve),
            ("complete", complete),
            ("renew", explain(&sql.renew, true, &[1, 100, 160]).await?),
            ("release", explain(&sql.release, true, &[1, 100]).await?),
            (
                "release_unconfirmed",
                explain(&sql.release_unconfirmed, true, &[1, 100]).await?,
            ),
            ("purge", explain(&sql.purge, false, &[100, 1000]).await?),
        ])
    }
}
