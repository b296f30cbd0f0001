//! How a waiting duplicate hears of another instance's completion (SPEC S15): one
//! dedicated `LISTEN` connection per store, outside the store's pool, feeding its
//! [`ChangeHub`](idem_core::ChangeHub) through a [`ChangeFeed`], which reconnects it. The
//! table's triggers (migration 3) `NOTIFY` on every completion or release of an
//! in-progress record.
//!
//! While the connection is down the hub is not live: its watches fire once (their
//! waiters reserve again) and new ones poll, until the connection is back and listening.

use idem_core::{ChangeFeed, FeedSession};
use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgPoolOptions};

use crate::error::ServerError;
use crate::schema::NOTIFY_CHANNEL;

/// Starts listening for `table`'s notifications on a connection of its own, made with
/// `pool`'s settings. Call inside a tokio runtime.
pub(crate) fn spawn(pool: &PgPool, table: &str) -> ChangeFeed {
    // A pool of one, for the listener's reconnections: the store's pool keeps all of
    // its connections for operations.
    let own = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with((*pool.connect_options()).clone());
    let prefix = format!("{table} ");
    ChangeFeed::spawn("the PostgreSQL store's LISTEN connection", move |session| {
        let serving = serve(own.clone(), prefix.clone(), session);
        async move { serving.await.map_err(ServerError) }
    })
}

/// One session: connect, listen, and pass the table's notifications on until the
/// connection fails.
async fn serve(pool: PgPool, prefix: String, session: FeedSession) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(NOTIFY_CHANNEL).await?;
    session.listening();
    loop {
        match listener.try_recv().await? {
            Some(notification) => {
                if let Some(digest) = notification.payload().strip_prefix(&prefix) {
                    session.changed(digest);
                }
            }
            // The connection broke and was made again underneath: what was sent
            // meanwhile is lost.
            None => session.missed(),
        }
    }
}
