//! `RabbitPublisher`: AMQP 0-9-1 publishes with publisher confirms.

use std::collections::HashSet;

use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::Mutex;

use crate::{Destination, Error, Message, Publish, PublishError, Result};

/// AMQP's persistent delivery mode: the broker writes the message to disk before it
/// confirms it (on a durable queue).
const PERSISTENT: u8 = 2;

/// The longest AMQP short string (message id, exchange, routing key), in bytes.
const SHORT_STRING_MAX: usize = 255;

/// RabbitMQ's default largest message (`max_message_size`, 128 MiB); bigger ones are
/// refused before they are sent.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 128 << 20;

/// Publishes to RabbitMQ (AMQP 0-9-1, through lapin) with publisher confirms: every
/// message persistent (delivery mode 2), its id in the `message-id` property, and
/// `mandatory` so that a message no queue takes comes back instead of vanishing. The
/// relay marks a message only after the broker's `basic.ack`.
///
/// Refused for good (parked): a message larger than the maximum, an exchange that
/// does not exist, a message nothing routes to a queue, an id or routing key over 255
/// bytes. A [`Destination::Subject`] goes through the default exchange to the queue of
/// that name. A lost connection is opened again on the next batch.
#[derive(Debug)]
pub struct RabbitPublisher {
    uri: String,
    max_message_size: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    connection: Option<Connection>,
    channel: Option<Channel>,
    /// Exchanges seen to exist: a publish to a missing exchange closes the channel,
    /// so each exchange is checked once, on a channel of its own.
    exchanges: HashSet<String>,
}

impl RabbitPublisher {
    /// Connects to `uri` (`amqp://user:password@host:5672/vhost`) and opens a channel
    /// in confirm mode.
    pub async fn connect(uri: &str) -> Result<RabbitPublisher> {
        let publisher = RabbitPublisher {
            uri: uri.to_owned(),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            state: Mutex::new(State::default()),
        };
        publisher
            .channel(&mut *publisher.state.lock().await)
            .await
            .map_err(Error::broker)?;
        Ok(publisher)
    }

    /// Refuses messages over `bytes` (set it to the broker's `max_message_size`).
    pub fn with_max_message_size(mut self, bytes: usize) -> RabbitPublisher {
        self.max_message_size = bytes;
        self
    }

    async fn channel(&self, state: &mut State) -> Result<Channel, lapin::Error> {
        if let Some(channel) = &state.channel
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let connected = state
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected());
        if !connected {
            state.connection =
                Some(Connection::connect(&self.uri, ConnectionProperties::default()).await?);
        }
        let connection = state.connection.as_ref().expect("connected above");
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        state.channel = Some(channel.clone());
        Ok(channel)
    }

    /// Whether `exchange` exists, asked on a throwaway channel (a passive declare of a
    /// missing exchange closes its channel).
    async fn exchange_exists(&self, state: &mut State, exchange: &str) -> Result<(), PublishError> {
        if exchange.is_empty() || state.exchanges.contains(exchange) {
            return Ok(());
        }
        let connection = state
            .connection
            .as_ref()
            .ok_or_else(|| PublishError::Transient("no connection".into()))?;
        let probe = connection.create_channel().await.map_err(transient)?;
        let declared = probe
            .exchange_declare(
                exchange.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        match declared {
            Ok(()) => {
                let _ = probe.close(200, "ok".into()).await;
                state.exchanges.insert(exchange.to_owned());
                Ok(())
            }
            Err(e) if is_not_found(&e) => Err(PublishError::Refused(format!(
                "no exchange {exchange:?} ({e})"
            ))),
            Err(e) => Err(transient(e)),
        }
    }

    fn check(&self, message: &Message) -> Result<(String, String), PublishError> {
        let (exchange, routing_key) = match &message.destination {
            Destination::Subject(queue) => (String::new(), queue.clone()),
            Destination::Exchange {
                exchange,
                routing_key,
            } => (exchange.clone(), routing_key.clone()),
        };
        for (what, value) in [
            ("message id", message.id.as_str()),
            ("exchange", &exchange),
            ("routing key", &routing_key),
        ] {
            if value.len() > SHORT_STRING_MAX {
                return Err(PublishError::Refused(format!(
                    "{what} of {} bytes, over AMQP's {SHORT_STRING_MAX}",
                    value.len()
                )));
            }
        }
        if message.body.len() > self.max_message_size {
            return Err(PublishError::Refused(format!(
                "{} bytes, over the maximum message size of {}",
                message.body.len(),
                self.max_message_size
            )));
        }
        Ok((exchange, routing_key))
    }
}

fn transient(e: lapin::Error) -> PublishError {
    PublishError::Transient(e.to_string())
}

/// A 404 NOT_FOUND channel close.
fn is_not_found(e: &lapin::Error) -> bool {
    e.to_string().contains("NOT_FOUND") || e.to_string().contains("404")
}

fn properties(message: &Message) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in &message.headers {
        headers.insert(
            ShortString::from(name.as_str()),
            AMQPValue::LongString(value.as_str().into()),
        );
    }
    BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_message_id(message.id.as_str().into())
        .with_headers(headers)
}

impl Publish for RabbitPublisher {
    async fn publish_all<'a>(
        &'a self,
        messages: &'a [&'a Message],
    ) -> Vec<Result<(), PublishError>> {
        let mut state = self.state.lock().await;
        let channel = match self.channel(&mut state).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "RabbitMQ unreachable");
                let error = transient(e);
                return messages.iter().map(|_| Err(error.clone())).collect();
            }
        };
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            let sent = match self.check(message) {
                Err(e) => Err(e),
                Ok((exchange, routing_key)) => {
                    match self.exchange_exists(&mut state, &exchange).await {
                        Err(e) => Err(e),
                        Ok(()) => channel
                            .basic_publish(
                                exchange.as_str().into(),
                                routing_key.as_str().into(),
                                BasicPublishOptions {
                                    mandatory: true,
                                    ..BasicPublishOptions::default()
                                },
                                &message.body,
                                properties(message),
                            )
                            .await
                            .map_err(transient),
                    }
                }
            };
            pending.push(sent);
        }
        let mut results = Vec::with_capacity(messages.len());
        for (sent, message) in pending.into_iter().zip(messages) {
            results.push(match sent {
                Err(e) => Err(e),
                Ok(confirm) => match confirm.await {
                    Ok(Confirmation::Ack(None)) => Ok(()),
                    Ok(Confirmation::Ack(Some(returned))) => Err(PublishError::Refused(format!(
                        "no queue takes it: {} {} (exchange {:?}, routing key {:?})",
                        returned.reply_code,
                        returned.reply_text,
                        returned.exchange.as_str(),
                        returned.routing_key.as_str()
                    ))),
                    Ok(Confirmation::Nack(_)) => Err(PublishError::Transient(format!(
                        "the broker nacked message {}",
                        message.id
                    ))),
                    Ok(Confirmation::NotRequested) => Err(PublishError::Transient(
                        "the channel is not in confirm mode".into(),
                    )),
                    Err(e) => Err(transient(e)),
                },
            });
        }
        if results
            .iter()
            .any(|r| matches!(r, Err(PublishError::Transient(_))))
        {
            // The channel may be dead; the next batch opens a fresh one.
            state.channel = None;
        }
        results
    }
}
