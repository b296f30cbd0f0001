//! The service of the orders-outbox example; see the crate's docs. Configured by the
//! environment (`orders_outbox::env`); killed, never stopped.

#[tokio::main]
async fn main() -> Result<(), orders_outbox::BoxError> {
    orders_outbox::serve().await
}
