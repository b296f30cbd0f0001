//! The NATS JetStream adapter: a pull-consumer loop that acks a message only after its
//! inbox transaction committed (SPEC S12), and a publisher that sets `Nats-Msg-Id`.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::MessagesErrorKind;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::{Context, Message};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;

use crate::{Error, Inbox, Outcome, Result, RetentionWarning};

/// The header JetStream de-duplicates publishes on, and the default message id.
pub const NATS_MSG_ID: &str = "Nats-Msg-Id";

/// Settings of a [`JetStreamInbox`].
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// The header holding the message id (default [`NATS_MSG_ID`]). A message without it
    /// falls back to its stream sequence, with a warning: that id catches redeliveries
    /// but not a message published twice.
    pub id_header: String,
    /// Messages processed at once (default 1). Each holds one database connection.
    pub concurrency: usize,
    /// Messages asked for per pull request (default 100).
    pub batch: usize,
    /// Delay of the redelivery asked for when processing fails (default 1 s).
    pub nak_delay: Duration,
}

impl Default for NatsOptions {
    fn default() -> Self {
        NatsOptions {
            id_header: NATS_MSG_ID.to_owned(),
            concurrency: 1,
            batch: 100,
            nak_delay: Duration::from_secs(1),
        }
    }
}

/// Where a message's id came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSource {
    /// The configured header.
    Header,
    /// The stream sequence (`seq:{stream}:{sequence}`), because the header was missing.
    StreamSequence,
}

/// One delivery, as the handler sees it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The id the inbox de-duplicates on.
    pub message_id: String,
    /// Where the id came from.
    pub id_source: IdSource,
    /// The subject the message was published to.
    pub subject: String,
    /// The payload.
    pub payload: Bytes,
    /// The headers.
    pub headers: Option<HeaderMap>,
    /// The message's sequence in its stream.
    pub stream_sequence: u64,
    /// How many times the message has been delivered, this time included.
    pub delivered: i64,
}

/// What a [`JetStreamInbox::run`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Messages whose effects ran and committed.
    pub processed: u64,
    /// Deliveries skipped as already processed (and acked).
    pub duplicates: u64,
    /// Deliveries that failed and were nak'ed for redelivery.
    pub failed: u64,
    /// Deliveries whose id fell back to the stream sequence.
    pub sequence_ids: u64,
    /// Acks or naks that could not be sent (the broker redelivers those messages).
    pub settle_errors: u64,
    /// Transient errors of the message stream (missed heartbeats and the like).
    pub stream_errors: u64,
}

#[derive(Default)]
struct Counters {
    processed: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    sequence_ids: AtomicU64,
    settle_errors: AtomicU64,
    stream_errors: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ConsumerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ConsumerStats {
            processed: get(&self.processed),
            duplicates: get(&self.duplicates),
            failed: get(&self.failed),
            sequence_ids: get(&self.sequence_ids),
            settle_errors: get(&self.settle_errors),
            stream_errors: get(&self.stream_errors),
        }
    }
}

/// A JetStream pull consumer whose messages go through an [`Inbox`]: each message's
/// effects run in the inbox's transaction, and the message is acked only after that
/// transaction committed (or the message proved a duplicate). A consumer that dies
/// before acking gets the message redelivered, and the redelivery is skipped if the
/// first attempt had committed.
///
/// The consumer must use explicit acks (`AckPolicy::Explicit`, JetStream's default for
/// pull consumers).
///
/// # Examples
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), idem_inbox::Error> {
/// use idem_inbox::{JetStreamInbox, NatsOptions, PgInbox};
///
/// let client = async_nats::connect("127.0.0.1:4222").await.map_err(idem_inbox::Error::broker)?;
/// let js = async_nats::jetstream::new(client);
/// let inbox = PgInbox::new(pool, "points")?;
/// inbox.migrate().await?;
/// let consumer = JetStreamInbox::new(js, "POINTS", "points", inbox, NatsOptions::default()).await?;
/// consumer.check_retention().await?;
/// let stats = consumer
///     .run(
///         |delivery, tx| {
///             Box::pin(async move {
///                 sqlx::query("INSERT INTO grants (message_id, body) VALUES ($1, $2)")
///                     .bind(delivery.message_id)
///                     .bind(delivery.payload.to_vec())
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
pub struct JetStreamInbox<I> {
    js: Context,
    consumer: PullConsumer,
    stream: String,
    inbox: I,
    options: NatsOptions,
}

impl<I: Inbox> JetStreamInbox<I> {
    /// Binds the existing durable consumer `consumer` of stream `stream` to `inbox`.
    pub async fn new(
        js: Context,
        stream: &str,
        consumer: &str,
        inbox: I,
        options: NatsOptions,
    ) -> Result<JetStreamInbox<I>> {
        let consumer: PullConsumer = js
            .get_consumer_from_stream(consumer, stream)
            .await
            .map_err(Error::broker)?;
        Ok(JetStreamInbox {
            js,
            consumer,
            stream: stream.to_owned(),
            inbox,
            options,
        })
    }

    /// The inbox.
    pub fn inbox(&self) -> &I {
        &self.inbox
    }

    /// The JetStream consumer.
    pub fn consumer(&self) -> &PullConsumer {
        &self.consumer
    }

    /// The longest time after which the broker may still deliver a message again: the
    /// stream's duplicate window, or the consumer's redelivery span (ack wait or
    /// backoff, and the nak delay, for each of `max_deliver` deliveries) bounded by the
    /// stream's max age. `Duration::MAX` when unbounded (unlimited deliveries and no max
    /// age).
    pub async fn broker_window(&self) -> Result<Duration> {
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(Error::broker)?
            .get_info()
            .await
            .map_err(Error::broker)?;
        let consumer = &self.consumer.cached_info().config;
        Ok(broker_window(
            stream.config.duplicate_window,
            stream.config.max_age,
            consumer.ack_wait,
            consumer.max_deliver,
            &consumer.backoff,
            self.options.nak_delay,
        ))
    }

    /// Compares the inbox's retention with [`broker_window`](Self::broker_window);
    /// returns (and logs) a warning when the retention is shorter.
    pub async fn check_retention(&self) -> Result<Option<RetentionWarning>> {
        let window = self.broker_window().await?;
        Ok(self.inbox.check_retention(window))
    }

    fn id_header<'m>(&self, message: &'m Message) -> Option<&'m str> {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(self.options.id_header.as_str()))
            .map(|v| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// The message's id: the configured header, else the stream sequence.
    pub fn message_id(&self, message: &Message) -> Result<(String, IdSource)> {
        if let Some(id) = self.id_header(message) {
            return Ok((id.to_owned(), IdSource::Header));
        }
        let info = message.info().map_err(Error::broker)?;
        Ok((
            format!("seq:{}:{}", info.stream, info.stream_sequence),
            IdSource::StreamSequence,
        ))
    }

    /// Runs one delivery through the inbox without settling it: the handler's effects
    /// and the processed-message row commit together, or a duplicate is reported. Follow
    /// with [`settle`](Self::settle); [`run`](Self::run) does both for every message.
    pub async fn process_message<H>(&self, message: &Message, handler: &H) -> Result<Outcome<()>>
    where
        H: for<'t> Fn(Delivery, &'t mut I::Tx) -> BoxFuture<'t, Result<()>> + Send + Sync,
    {
        let (message_id, id_source) = self.message_id(message)?;
        let info = message.info().map_err(Error::broker)?;
        if id_source == IdSource::StreamSequence {
            tracing::warn!(
                header = %self.options.id_header,
                stream = info.stream,
                sequence = info.stream_sequence,
                "message has no id header; de-duplicating on the stream sequence, \
                 which does not catch a message published twice"
            );
        }
        let delivery = Delivery {
            message_id: message_id.clone(),
            id_source,
            subject: message.subject.to_string(),
            payload: message.payload.clone(),
            headers: message.headers.clone(),
            stream_sequence: info.stream_sequence,
            delivered: info.delivered,
        };
        self.inbox
            .process(&message_id, move |tx| handler(delivery, tx))
            .await
    }

    /// Acks a processed or duplicate delivery; naks a failed one with a delay (the
    /// other consumer's lease for [`Error::InFlight`], else
    /// [`NatsOptions::nak_delay`]) so the broker redelivers it. A message whose id the
    /// inbox refuses ([`Error::Invalid`]) can never succeed and is terminated instead.
    pub async fn settle(&self, message: &Message, result: &Result<Outcome<()>>) -> Result<()> {
        let kind = match result {
            Ok(_) => AckKind::Ack,
            Err(Error::InFlight { retry_after }) => AckKind::Nak(Some(*retry_after)),
            Err(e @ Error::Invalid { .. }) => {
                tracing::error!(error = %e, "terminating a message that can never be processed");
                AckKind::Term
            }
            Err(_) => AckKind::Nak(Some(self.options.nak_delay)),
        };
        message.ack_with(kind).await.map_err(Error::broker)
    }

    /// Pulls and processes messages until `shutdown` completes, then finishes the
    /// messages in hand, flushes the acks and returns what it did. Messages pulled but
    /// not started are left unacked and come back after the ack wait.
    ///
    /// Returns an error when the message stream cannot go on (the consumer was deleted,
    /// or the server refused the pull request).
    pub async fn run<H, S>(&self, handler: H, shutdown: S) -> Result<ConsumerStats>
    where
        H: for<'t> Fn(Delivery, &'t mut I::Tx) -> BoxFuture<'t, Result<()>> + Send + Sync,
        S: Future<Output = ()> + Send,
    {
        let messages = self
            .consumer
            .stream()
            .max_messages_per_batch(self.options.batch.max(1))
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await
            .map_err(Error::broker)?;
        let counters = Counters::default();
        let fatal: Mutex<Option<Error>> = Mutex::new(None);
        let handler = &handler;
        let counters_ref = &counters;
        messages
            .take_until(shutdown)
            .take_while(|item| {
                let fatal_kind = match item {
                    Err(e) => matches!(
                        e.kind(),
                        MessagesErrorKind::ConsumerDeleted
                            | MessagesErrorKind::PushBasedConsumer
                            | MessagesErrorKind::RequestLimitExceeded
                    ),
                    Ok(_) => false,
                };
                if let (true, Err(e)) = (fatal_kind, item) {
                    *fatal.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(Error::broker(e.to_string()));
                }
                std::future::ready(!fatal_kind)
            })
            .filter_map(|item| {
                std::future::ready(match item {
                    Ok(message) => Some(message),
                    Err(e) => {
                        tracing::warn!(error = %e, "JetStream message stream error");
                        Counters::bump(&counters_ref.stream_errors);
                        None
                    }
                })
            })
            .for_each_concurrent(self.options.concurrency.max(1), |message| async move {
                let result = self.process_message(&message, handler).await;
                if self.id_header(&message).is_none() {
                    Counters::bump(&counters_ref.sequence_ids);
                }
                match &result {
                    Ok(Outcome::Processed(())) => Counters::bump(&counters_ref.processed),
                    Ok(Outcome::Duplicate) => Counters::bump(&counters_ref.duplicates),
                    Err(e) => {
                        tracing::warn!(error = %e, "message processing failed; nak'ed for redelivery");
                        Counters::bump(&counters_ref.failed);
                    }
                }
                if let Err(e) = self.settle(&message, &result).await {
                    tracing::warn!(error = %e, "could not settle a message; it will be redelivered");
                    Counters::bump(&counters_ref.settle_errors);
                }
            })
            .await;
        // Acks are fire-and-forget publishes: push them out before returning.
        self.js.client().flush().await.map_err(Error::broker)?;
        match fatal.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(counters.snapshot()),
        }
    }
}

/// Names a handler's type for [`JetStreamInbox::run`]: wrapping a closure in it lets
/// the compiler see that the returned future borrows the transaction, which it cannot
/// infer for a closure stored in a variable or returned from a function first.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem_inbox::{Delivery, handler};
/// let h = handler(|d: Delivery, tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>| {
///     Box::pin(async move {
///         sqlx::query("INSERT INTO seen (id) VALUES (?1)")
///             .bind(d.message_id)
///             .execute(&mut **tx)
///             .await?;
///         Ok(())
///     })
/// });
/// # let _ = h; }
/// ```
pub fn handler<Tx, F>(f: F) -> F
where
    F: for<'t> Fn(Delivery, &'t mut Tx) -> BoxFuture<'t, Result<()>>,
{
    f
}

/// The broker's redelivery / duplicate window; see [`JetStreamInbox::broker_window`].
/// `max_deliver` of zero or less means unlimited; a zero `max_age` means no limit.
pub fn broker_window(
    duplicate_window: Duration,
    max_age: Duration,
    ack_wait: Duration,
    max_deliver: i64,
    backoff: &[Duration],
    nak_delay: Duration,
) -> Duration {
    let redelivery = match u64::try_from(max_deliver) {
        Ok(n) if n > 0 => (0..n).fold(Duration::ZERO, |sum, i| {
            let wait = usize::try_from(i)
                .ok()
                .and_then(|i| backoff.get(i))
                .or(backoff.last())
                .copied()
                .unwrap_or(ack_wait);
            sum.saturating_add(wait.max(nak_delay))
        }),
        _ => Duration::MAX,
    };
    let redelivery = if max_age.is_zero() {
        redelivery
    } else {
        redelivery.min(max_age)
    };
    redelivery.max(duplicate_window)
}

/// Publishes with `Nats-Msg-Id` set, so that JetStream's own duplicate window drops a
/// republished message before any consumer sees it; the inbox catches what gets past
/// it (republishes after the window, redeliveries).
#[derive(Debug, Clone)]
pub struct Publisher {
    js: Context,
}

impl Publisher {
    /// A publisher on `js`.
    pub fn new(js: Context) -> Publisher {
        Publisher { js }
    }

    /// Publishes `payload` to `subject` as message `message_id` and waits for the
    /// stream's ack (whose `duplicate` flag tells whether JetStream dropped it).
    pub async fn publish(
        &self,
        subject: impl Into<String>,
        message_id: &str,
        payload: Bytes,
    ) -> Result<PublishAck> {
        self.send(subject, message_id, HeaderMap::new(), payload)
            .await?
            .await
            .map_err(Error::broker)
    }

    /// Sends `payload` with `headers` as message `message_id` without waiting for the
    /// ack; await the returned future for it. Lets a producer keep many publishes in
    /// flight.
    pub async fn send(
        &self,
        subject: impl Into<String>,
        message_id: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<PublishAckFuture> {
        crate::inbox::validate_id("message id", message_id)?;
        self.js
            .send_publish(
                subject.into(),
                PublishMessage::build()
                    .headers(headers)
                    .payload(payload)
                    .message_id(message_id),
            )
            .await
            .map_err(Error::broker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn window_is_ack_wait_times_deliveries_or_duplicate_window() {
        // 5 deliveries of 30 s ack wait = 150 s, longer than the 2 min duplicate window.
        assert_eq!(broker_window(S(120), S(0), S(30), 5, &[], S(1)), S(150));
        // 2 deliveries of 30 s: the 2 min duplicate window dominates.
        assert_eq!(broker_window(S(120), S(0), S(30), 2, &[], S(1)), S(120));
    }

    #[test]
    fn window_follows_backoff_and_nak_delay() {
        // Backoff 1 s, 10 s, then its last entry repeats: 1 + 10 + 10 + 10.
        assert_eq!(
            broker_window(S(0), S(0), S(30), 4, &[S(1), S(10)], S(0)),
            S(31)
        );
        // A nak delay longer than the ack wait stretches every delivery.
        assert_eq!(broker_window(S(0), S(0), S(1), 3, &[], S(5)), S(15));
    }

    #[test]
    fn unlimited_deliveries_are_bounded_only_by_max_age() {
        assert_eq!(
            broker_window(S(120), S(0), S(30), -1, &[], S(1)),
            Duration::MAX
        );
        assert_eq!(
            broker_window(S(120), S(86_400), S(30), -1, &[], S(1)),
            S(86_400)
        );
    }
}
