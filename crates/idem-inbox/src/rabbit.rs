//! The RabbitMQ adapter: a consumer that acks a message only after its inbox
//! transaction committed (SPEC S12), de-duplicating redeliveries on the AMQP
//! `message-id`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::{BoxFuture, FusedFuture};
use futures_util::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

use crate::{Error, Inbox, Outcome, Result};

/// Settings of a [`RabbitInbox`].
#[derive(Debug, Clone)]
pub struct RabbitOptions {
    /// A header to take the message id from when a message has no `message-id`
    /// property (default `None`: such a message is refused with a clear error, since
    /// without an id a redelivery cannot be told from a new message).
    pub id_header: Option<String>,
    /// Unacked messages the broker sends ahead (`basic.qos` prefetch, default 32).
    pub prefetch: u16,
    /// Messages processed at once (default 1). Each holds one database connection.
    pub concurrency: usize,
    /// How long a failed message is held before it is nack'ed back to the queue
    /// (default 1 s), so a failing handler does not spin.
    pub requeue_delay: Duration,
    /// The first wait before reconnecting (default 200 ms); it doubles up to 10 s.
    pub reconnect_backoff: Duration,
}

impl Default for RabbitOptions {
    fn default() -> Self {
        RabbitOptions {
            id_header: None,
            prefetch: 32,
            concurrency: 1,
            requeue_delay: Duration::from_secs(1),
            reconnect_backoff: Duration::from_millis(200),
        }
    }
}

/// A queue's type, for [`RabbitInbox::declare_queue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueType {
    /// A classic durable queue.
    Classic,
    /// A quorum queue (replicated, `x-queue-type: quorum`).
    Quorum,
}

/// One delivery, as the handler sees it.
#[derive(Debug, Clone)]
pub struct RabbitDelivery {
    /// The id the inbox de-duplicates on.
    pub message_id: String,
    /// The exchange it was published to (empty for the default exchange).
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// The body.
    pub payload: Vec<u8>,
    /// The AMQP headers.
    pub headers: Option<FieldTable>,
    /// Whether the broker delivered it before (to this or another consumer).
    pub redelivered: bool,
}

/// What a [`RabbitInbox::run`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RabbitStats {
    /// Messages whose effects ran and committed (then acked).
    pub processed: u64,
    /// Deliveries skipped as already processed (and acked).
    pub duplicates: u64,
    /// Deliveries that failed and were nack'ed back to the queue.
    pub failed: u64,
    /// Deliveries rejected for good (no message id): dead-lettered if the queue has a
    /// dead-letter exchange, else dropped by the broker.
    pub rejected: u64,
    /// Acks, nacks or rejects that could not be sent (the broker redelivers those).
    pub settle_errors: u64,
    /// Connections lost and opened again.
    pub reconnects: u64,
}

#[derive(Default)]
struct Counters([AtomicU64; 6]);

impl Counters {
    const PROCESSED: usize = 0;
    const DUPLICATES: usize = 1;
    const FAILED: usize = 2;
    const REJECTED: usize = 3;
    const SETTLE_ERRORS: usize = 4;
    const RECONNECTS: usize = 5;

    fn bump(&self, i: usize) {
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> RabbitStats {
        let get = |i: usize| self.0[i].load(Ordering::Relaxed);
        RabbitStats {
            processed: get(Self::PROCESSED),
            duplicates: get(Self::DUPLICATES),
            failed: get(Self::FAILED),
            rejected: get(Self::REJECTED),
            settle_errors: get(Self::SETTLE_ERRORS),
            reconnects: get(Self::RECONNECTS),
        }
    }
}

/// A RabbitMQ queue consumer whose messages go through an [`Inbox`]: manual acks, each
/// sent only after the message's inbox transaction committed (or it proved a
/// duplicate). A consumer that dies before acking has its messages redelivered by the
/// broker, and the inbox skips those that had committed. Redeliveries are told apart by
/// the AMQP `message-id` property (set by `idem-outbox`'s RabbitMQ publisher), or a
/// configured header.
///
/// The connection is opened again (with a backoff) when it is lost; the prefetch bounds
/// the unacked messages in hand.
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), idem_inbox::Error> {
/// use idem_inbox::{PgInbox, QueueType, RabbitInbox, RabbitOptions};
///
/// let uri = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// RabbitInbox::<PgInbox>::declare_queue(uri, "points", QueueType::Quorum).await?;
/// let inbox = PgInbox::new(pool, "points")?;
/// inbox.migrate().await?;
/// let consumer = RabbitInbox::new(uri, "points", inbox, RabbitOptions::default());
/// let stats = consumer
///     .run(
///         |delivery, tx| {
///             Box::pin(async move {
///                 sqlx::query("INSERT INTO grants (message_id) VALUES ($1)")
///                     .bind(delivery.message_id)
///                     .execute(&mut **tx)
///                     .await?;
///                 Ok(())
///             })
///         },
///         std::future::pending::<()>(),
///     )
///     .await?;
/// # let _ = stats; Ok(()) }
/// ```
#[derive(Debug)]
pub struct RabbitInbox<I> {
    uri: String,
    queue: String,
    inbox: I,
    options: RabbitOptions,
}

impl<I: Inbox> RabbitInbox<I> {
    /// A consumer of `queue` on the broker at `uri` through `inbox`.
    pub fn new(uri: &str, queue: &str, inbox: I, options: RabbitOptions) -> RabbitInbox<I> {
        RabbitInbox {
            uri: uri.to_owned(),
            queue: queue.to_owned(),
            inbox,
            options,
        }
    }

    /// The inbox.
    pub fn inbox(&self) -> &I {
        &self.inbox
    }

    /// Declares `queue` as a durable queue of type `kind` (idempotent; fails if it
    /// exists with another type).
    pub async fn declare_queue(uri: &str, queue: &str, kind: QueueType) -> Result<()> {
        let connection = Connection::connect(uri, ConnectionProperties::default())
            .await
            .map_err(Error::broker)?;
        let channel = connection.create_channel().await.map_err(Error::broker)?;
        let mut arguments = FieldTable::default();
        let kind = match kind {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
        };
        arguments.insert("x-queue-type".into(), AMQPValue::LongString(kind.into()));
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                arguments,
            )
            .await
            .map_err(Error::broker)?;
        let _ = connection.close(200, "declared".into()).await;
        Ok(())
    }

    /// The delivery's id: the `message-id` property, else the configured header; an
    /// [`Error::Invalid`] when it has neither.
    pub fn message_id(&self, delivery: &lapin::message::Delivery) -> Result<String> {
        if let Some(id) = delivery.properties.message_id()
            && !id.as_str().is_empty()
        {
            return Ok(id.as_str().to_owned());
        }
        let from_header = self.options.id_header.as_deref().and_then(|name| {
            let headers = delivery.properties.headers().as_ref()?;
            match headers.inner().get(name)? {
                AMQPValue::LongString(s) => {
                    Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                }
                AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
                _ => None,
            }
        });
        match (from_header, &self.options.id_header) {
            (Some(id), _) if !id.is_empty() => Ok(id),
            (_, Some(name)) => Err(Error::Invalid {
                what: "message id",
                reason: format!(
                    "the message has neither a message-id property nor a {name:?} header"
                ),
            }),
            (_, None) => Err(Error::Invalid {
                what: "message id",
                reason: "the message has no message-id property, so a redelivery could not be \
                         told from a new message; publish with message-id or configure \
                         RabbitOptions::id_header"
                    .to_owned(),
            }),
        }
    }

    /// Runs one delivery through the inbox without settling it.
    pub async fn process_delivery<H>(
        &self,
        delivery: &lapin::message::Delivery,
        handler: &H,
    ) -> Result<Outcome<()>>
    where
        H: for<'t> Fn(RabbitDelivery, &'t mut I::Tx) -> BoxFuture<'t, Result<()>> + Send + Sync,
    {
        let message_id = self.message_id(delivery)?;
        let d = RabbitDelivery {
            message_id: message_id.clone(),
            exchange: delivery.exchange.as_str().to_owned(),
            routing_key: delivery.routing_key.as_str().to_owned(),
            payload: delivery.data.clone(),
            headers: delivery.properties.headers().clone(),
            redelivered: delivery.redelivered,
        };
        self.inbox
            .process(&message_id, move |tx| handler(d, tx))
            .await
    }

    /// Consumes until `shutdown` completes, then finishes the messages in hand and
    /// returns what it did. A lost connection is opened again after a backoff; the
    /// messages it had not acked come back from the broker and are de-duplicated.
    ///
    /// Returns an error only when the first connection cannot be made or the queue
    /// cannot be consumed (it does not exist).
    pub async fn run<H, S>(&self, handler: H, shutdown: S) -> Result<RabbitStats>
    where
        H: for<'t> Fn(RabbitDelivery, &'t mut I::Tx) -> BoxFuture<'t, Result<()>> + Send + Sync,
        S: Future<Output = ()> + Send,
    {
        let counters = Counters::default();
        let mut shutdown = std::pin::pin!(shutdown.fuse());
        let mut first = true;
        let mut backoff = self.options.reconnect_backoff;
        while !shutdown.is_terminated() {
            let consumer = match self.consume().await {
                Ok(c) => c,
                Err(e) if first => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, queue = %self.queue, "RabbitMQ reconnect failed");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            if !first {
                counters.bump(Counters::RECONNECTS);
            }
            first = false;
            backoff = self.options.reconnect_backoff;
            let (connection, consumer) = consumer;
            // A cut connection does not always end the consumer's stream: its error
            // event does.
            let mut events =
                std::pin::pin!(connection.events_listener().filter(|event| {
                    std::future::ready(matches!(event, lapin::Event::Error(_)))
                }));
            let lost = events.next();
            let stop = async {
                tokio::select! {
                    () = &mut shutdown => {}
                    Some(lapin::Event::Error(e)) = lost => {
                        tracing::warn!(error = %e, queue = %self.queue, "RabbitMQ connection lost; reconnecting");
                    }
                }
            };
            let handler = &handler;
            let counters = &counters;
            consumer
                .take_until(stop)
                .take_while(|item| {
                    if let Err(e) = item {
                        tracing::warn!(error = %e, queue = %self.queue, "RabbitMQ consumer lost; reconnecting");
                    }
                    std::future::ready(item.is_ok())
                })
                .filter_map(|item| std::future::ready(item.ok()))
                .for_each_concurrent(self.options.concurrency.max(1), |delivery| async move {
                    let result = self.process_delivery(&delivery, handler).await;
                    let settled = match &result {
                        Ok(outcome) => {
                            counters.bump(if outcome.is_duplicate() {
                                Counters::DUPLICATES
                            } else {
                                Counters::PROCESSED
                            });
                            delivery.ack(BasicAckOptions::default()).await
                        }
                        Err(e @ Error::Invalid { .. }) => {
                            tracing::error!(error = %e, queue = %self.queue, "rejecting a message that can never be de-duplicated");
                            counters.bump(Counters::REJECTED);
                            delivery
                                .reject(BasicRejectOptions { requeue: false })
                                .await
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "message processing failed; requeued");
                            counters.bump(Counters::FAILED);
                            tokio::time::sleep(self.options.requeue_delay).await;
                            delivery
                                .nack(BasicNackOptions {
                                    requeue: true,
                                    ..BasicNackOptions::default()
                                })
                                .await
                        }
                    };
                    if let Err(e) = settled {
                        tracing::warn!(error = %e, "could not settle a message; it will be redelivered");
                        counters.bump(Counters::SETTLE_ERRORS);
                    }
                })
                .await;
            if !shutdown.is_terminated() {
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(backoff) => {}
                }
            }
        }
        Ok(counters.snapshot())
    }

    async fn consume(&self) -> Result<(Connection, lapin::Consumer)> {
        let connection = Connection::connect(&self.uri, ConnectionProperties::default())
            .await
            .map_err(Error::broker)?;
        let channel = connection.create_channel().await.map_err(Error::broker)?;
        channel
            .basic_qos(self.options.prefetch.max(1), BasicQosOptions::default())
            .await
            .map_err(Error::broker)?;
        let consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(Error::broker)?;
        Ok((connection, consumer))
    }
}
