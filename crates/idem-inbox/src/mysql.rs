//! `MySqlInbox`: the processed-message table in MySQL or MariaDB.

use sqlx::MySql;

use crate::SqlInbox;

/// An [`Inbox`](crate::Inbox) whose processed-message table lives in MySQL or MariaDB
/// (InnoDB), next to the consumer's own tables: the effects run inside the transaction
/// that records the message, so both commit or neither does. Any number of consumer
/// processes on any number of machines may share one table.
///
/// The row is written with `INSERT IGNORE` (MySQL has no `ON CONFLICT … DO NOTHING`):
/// a delivery whose message another transaction is processing waits on that
/// transaction's lock of the row, then skips (it committed) or processes (it rolled
/// back). When two or more deliveries wait on an attempt that rolls back, InnoDB lets
/// one of them insert and ends the other with a deadlock (1213): that one fails with
/// [`Error::Database`](crate::Error::Database), and its redelivery is a duplicate. The
/// message id and consumer name are `VARBINARY(512)`, compared byte for byte (no
/// trailing-space padding, no case folding), so no two ids of
/// [`MAX_ID_LEN`](crate::MAX_ID_LEN) bytes or fewer are taken for one.
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::MySqlPool) -> Result<(), idem_inbox::Error> {
/// use idem_inbox::{Inbox, MySqlInbox, Outcome};
///
/// let inbox = MySqlInbox::new(pool, "points")?;
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
pub type MySqlInbox = SqlInbox<MySql>;
