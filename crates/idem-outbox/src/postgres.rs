//! `PgOutbox`: the outbox table in PostgreSQL, shared by several relays.

use std::time::Duration;

use sqlx::postgres::{PgArguments, PgListener};
use sqlx::query::Query;
use sqlx::{Pool, Postgres, Transaction};

use crate::outbox::now_ms;
use crate::sql::{OutboxDatabase, SqlOutbox, claim_rows, sealed};
use crate::{Result, StagedMessage};

/// An [`Outbox`](crate::Outbox) whose table lives in PostgreSQL, next to the business
/// tables: [`stage`](crate::Outbox::stage) runs in the caller's transaction and
/// notifies the relays on commit (`NOTIFY`, delivered only if the transaction commits).
///
/// Any number of relays may share the table. A relay claims its batch with
/// `FOR UPDATE SKIP LOCKED` and holds the rows' locks until it marked them, so that
/// two relays never publish the same message while both are alive; a message whose
/// ordering key has an earlier message claimed by another relay waits for it.
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), idem_outbox::Error> {
/// use idem_outbox::{Destination, Message, Outbox, PgOutbox};
///
/// let outbox = PgOutbox::new(pool.clone());
/// outbox.migrate().await?;
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
/// let event = Message::with_id("order-42.created", Destination::subject("orders.created"), "{}")
///     .ordering_key("order-42");
/// outbox.stage(&mut tx, &event).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub type PgOutbox = SqlOutbox<Postgres>;

impl sealed::Sealed for Postgres {}

impl OutboxDatabase for Postgres {
    type Batch = Option<Transaction<'static, Postgres>>;
    type Listener = Option<PgListener>;
    type Extra = ();
    const SEQ_IN: &'static str = "= ANY($2)";
    const STAGE_TAKES_CHANNEL: bool = true;

    /// One round trip: the insert, and the notification the commit delivers; a row
    /// (one affected) only when it inserted.
    fn stage_statement(insert: String) -> String {
        format!("WITH ins AS ({insert} RETURNING seq) SELECT pg_notify($9, '') FROM ins")
    }

    fn extra_tables(_: &str) -> Vec<String> {
        Vec::new()
    }

    fn extra(_: &str) {}

    fn bind_seqs(
        query: Query<'_, Postgres, PgArguments>,
        seqs: Vec<i64>,
    ) -> Query<'_, Postgres, PgArguments> {
        query.bind(seqs)
    }

    async fn claim(
        outbox: &PgOutbox,
        _relay: &str,
        limit: usize,
    ) -> Result<(Self::Batch, Vec<StagedMessage>)> {
        let mut tx = outbox.pool.begin().await?;
        let staged = claim_rows(&outbox.sql.claim, &mut *tx, now_ms(), limit).await?;
        if staged.is_empty() {
            tx.rollback().await?;
            return Ok((None, Vec::new()));
        }
        Ok((Some(tx), staged))
    }

    async fn settling(
        _: &Pool<Postgres>,
        batch: Self::Batch,
    ) -> Result<Option<Transaction<'static, Postgres>>> {
        Ok(batch)
    }

    async fn listen(outbox: &PgOutbox) -> Result<Option<PgListener>> {
        let mut listener = PgListener::connect_with(&outbox.pool).await?;
        listener.listen(&outbox.table).await?;
        Ok(Some(listener))
    }

    async fn wait_for_work(
        outbox: &PgOutbox,
        listener: &mut Option<PgListener>,
        timeout: Duration,
    ) {
        let Some(l) = listener else {
            tokio::time::sleep(timeout).await;
            if let Ok(again) = Self::listen(outbox).await {
                *listener = again;
            }
            return;
        };
        match tokio::time::timeout(timeout, l.recv()).await {
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(e)) => {
                // Polling covers the gap: the next wait listens again.
                tracing::warn!(error = %e, "outbox LISTEN connection failed; polling");
                *listener = None;
            }
        }
    }
}
