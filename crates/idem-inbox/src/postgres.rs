//! `PgInbox`: the processed-message table in PostgreSQL.

use sqlx::Postgres;

use crate::SqlInbox;

/// An [`Inbox`](crate::Inbox) whose processed-message table lives in PostgreSQL, next
/// to the consumer's own tables: the effects run inside the transaction that records
/// the message, so both commit or neither does. Any number of consumer processes on any
/// number of machines may share one table.
///
/// A delivery whose message is being processed by another transaction waits on that
/// transaction's row lock, then skips (it committed) or processes (it rolled back).
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), idem_inbox::Error> {
/// use idem_inbox::{Inbox, Outcome, PgInbox};
///
/// let inbox = PgInbox::new(pool, "points")?;
/// inbox.migrate().await?;
/// let outcome = inbox
///     .process("msg-1", |tx| {
///         Box::pin(async move {
///             sqlx::query("UPDATE balances SET points = points + 10 WHERE account = 'a'")
///                 .execute(&mut **tx)
///                 .await?;
///             Ok::<_, idem_inbox::Error>(())
///         })
///     })
///     .await?;
/// assert_eq!(outcome, Outcome::Processed(()));
/// # Ok(()) }
/// ```
pub type PgInbox = SqlInbox<Postgres>;
