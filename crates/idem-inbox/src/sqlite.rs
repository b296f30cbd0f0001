//! `SqliteInbox`: the processed-message table in SQLite.

use sqlx::Sqlite;

use crate::SqlInbox;

/// An [`Inbox`](crate::Inbox) whose processed-message table lives in SQLite, next to
/// the consumer's own tables: the effects run inside the transaction that records the
/// message, so both commit or neither does.
///
/// Give the pool a busy timeout (sqlx's default is 5 s): concurrent deliveries of one
/// message wait on each other's write lock.
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::SqlitePool) -> Result<(), idem_inbox::Error> {
/// use idem_inbox::{Inbox, Outcome, SqliteInbox};
///
/// let inbox = SqliteInbox::new(pool, "points")?;
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
pub type SqliteInbox = SqlInbox<Sqlite>;
