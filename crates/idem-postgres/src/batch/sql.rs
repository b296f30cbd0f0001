//! The batch statements: one per kind of operation, each taking its members as arrays
//! (`unnest … WITH ORDINALITY`) and saying which member each row it returns is for
//! (`n`, counted from 1).
//!
//! Each mirrors the single-row statement of [`Statements`](crate::statements::Statements)
//! that it batches, row for row. The reserve's `ON CONFLICT … WHERE` (decide()'s
//! `Execute` rows) is one text for both ([`reserve_takes`](crate::statements::reserve_takes));
//! the fencing of completes and releases is repeated, and a change to one belongs in the
//! other.

use std::sync::Arc;

use crate::statements::RECORD_COLUMNS;

/// The batch statements for one table.
pub(crate) struct BatchStatements {
    pub(crate) reserve: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) release: Arc<str>,
}

/// `RECORD_COLUMNS`, each qualified by `alias`.
fn qualified(alias: &str) -> String {
    RECORD_COLUMNS
        .split(',')
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl BatchStatements {
    pub(crate) fn for_table(t: &str) -> BatchStatements {
        // reserve: $1 tenants, $2 endpoints, $3 keys, $4 fingerprints, $5 the expiry of
        // each fresh record, $6 the new tokens, $7 each lease's end; $8 now. The scopes
        // are distinct (the batcher sends at most one member per scope), so no row is
        // affected twice. Rows are inserted in the scopes' byte order, the same in every
        // batch, so that two batches wanting overlapping scopes lock them in one order
        // and never deadlock on each other.
        let ins = qualified("ins");
        let r = qualified("r");
        let row = qualified("t");
        let take = crate::statements::reserve_takes("$8");
        let reserve = format!(
            "WITH input AS (
                SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BYTEA[],
                                     $5::BIGINT[], $6::BIGINT[], $7::BIGINT[])
                  WITH ORDINALITY AS i(tenant, endpoint, idem_key, fingerprint, expires_at,
                                       token, lease_until, n)
            ),
            ins AS (
                INSERT INTO {t} AS r (tenant, endpoint, idem_key, fingerprint, created_at,
                                      expires_at, attempt, token, state, lease_until)
                SELECT tenant, endpoint, idem_key, fingerprint, $8::BIGINT, expires_at, 1,
                       token, 'in_progress', lease_until
                  FROM input
                 ORDER BY tenant COLLATE \"C\", endpoint COLLATE \"C\", idem_key COLLATE \"C\"
                {take}
                RETURNING r.tenant, r.endpoint, r.idem_key, {r}
            )
            SELECT TRUE AS acquired, input.n, {ins}
              FROM ins JOIN input ON ins.tenant = input.tenant
                   AND ins.endpoint = input.endpoint AND ins.idem_key = input.idem_key
            UNION ALL
            SELECT FALSE AS acquired, input.n, {row}
              FROM input JOIN {t} t ON t.tenant = input.tenant
                   AND t.endpoint = input.endpoint AND t.idem_key = input.idem_key
             WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.tenant = input.tenant
                   AND ins.endpoint = input.endpoint AND ins.idem_key = input.idem_key)"
        );
        // complete: $1..$3 the scopes, $4 tokens, $5 statuses, $6 headers, $7 bodies,
        // $8 TTLs in ms; $9 now; $10 tombstone TTLs in ms; $11 ambiguity reasons (or
        // NULLs). As the single-row complete:
        // the expiry becomes creation + TTL, never later than it was, and the
        // tombstone ends the tombstone TTL after it.
        let expiry = crate::statements::completed_expiry("r", "i.ttl", "i.tombstone");
        let complete = format!(
            "UPDATE {t} AS r SET state = 'completed', lease_until = NULL, status = i.status,
                    headers = i.headers, body = i.body, completed_at = $9::BIGINT,
                    ambiguity = i.ambiguity, {expiry}
               FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::INT4[],
                           $6::BYTEA[], $7::BYTEA[], $8::BIGINT[], $10::BIGINT[], $11::TEXT[])
                    WITH ORDINALITY AS i(tenant, endpoint, idem_key, token, status, headers,
                                         body, ttl, tombstone, ambiguity, n)
              WHERE r.tenant = i.tenant AND r.endpoint = i.endpoint
                AND r.idem_key = i.idem_key AND r.token = i.token
                AND r.expires_at > $9 AND r.state = 'in_progress'
             RETURNING i.n"
        );
        // release: $1..$3 the scopes, $4 tokens; $5 now.
        let release = format!(
            "DELETE FROM {t} AS r
              USING unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[])
                    WITH ORDINALITY AS i(tenant, endpoint, idem_key, token, n)
              WHERE r.tenant = i.tenant AND r.endpoint = i.endpoint
                AND r.idem_key = i.idem_key AND r.token = i.token
                AND r.expires_at > $5 AND r.state = 'in_progress'
             RETURNING i.n"
        );
        BatchStatements {
            reserve: reserve.into(),
            complete: complete.into(),
            release: release.into(),
        }
    }
}
