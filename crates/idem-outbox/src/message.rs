//! What a message is, as the caller stages it and the relay reads it back.

use crate::{Error, Result};

/// The longest message id, ordering key or destination part the outbox stores, in
/// bytes (the inbox's bound on the consumer side, and AMQP's short-string limit is
/// 255, checked by the RabbitMQ publisher).
pub const MAX_ID_LEN: usize = 512;

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A subject: a NATS subject, or for RabbitMQ the default exchange with the subject
    /// as routing key (a queue of that name).
    Subject(String),
    /// An AMQP exchange and routing key. NATS has no exchanges: a NATS relay parks such
    /// a message with a clear error.
    Exchange {
        /// The exchange's name.
        exchange: String,
        /// The routing key.
        routing_key: String,
    },
}

impl Destination {
    /// A subject (NATS) or queue name through the default exchange (RabbitMQ).
    pub fn subject(subject: impl Into<String>) -> Destination {
        Destination::Subject(subject.into())
    }

    /// An AMQP exchange with a routing key.
    pub fn exchange(exchange: impl Into<String>, routing_key: impl Into<String>) -> Destination {
        Destination::Exchange {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        }
    }

    /// The two columns it is stored in: `destination` and `routing_key` (NULL for a
    /// subject).
    pub(crate) fn columns(&self) -> (&str, Option<&str>) {
        match self {
            Destination::Subject(s) => (s, None),
            Destination::Exchange {
                exchange,
                routing_key,
            } => (exchange, Some(routing_key)),
        }
    }

    pub(crate) fn from_columns(destination: String, routing_key: Option<String>) -> Destination {
        match routing_key {
            None => Destination::Subject(destination),
            Some(routing_key) => Destination::Exchange {
                exchange: destination,
                routing_key,
            },
        }
    }
}

/// A message to stage: its id (the consumer's de-duplication id, sent as `Nats-Msg-Id`
/// or the AMQP `message-id`), its destination, headers and body, and optionally an
/// ordering key: messages with the same key are published in the order they were
/// staged, each only after the broker confirmed the one before. (Two transactions that
/// stage under one key at the same time are ordered by their commits: the relay sees a
/// message once its transaction committed. Writes to one aggregate usually lock its row,
/// which orders them anyway.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The message id, unique per outbox table.
    pub id: String,
    /// Where it goes.
    pub destination: Destination,
    /// Headers, sent as NATS headers or AMQP header-table entries.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// Messages sharing this key keep their order; `None`: no order with any other.
    pub ordering_key: Option<String>,
}

impl Message {
    /// A message with a random (UUIDv4) id, no headers and no ordering key.
    pub fn new(destination: Destination, body: impl Into<Vec<u8>>) -> Message {
        Message::with_id(uuid::Uuid::new_v4().to_string(), destination, body)
    }

    /// A message with the id `id` (derive it from the business record, e.g.
    /// `order-42.created`, so that staging it twice is noticed).
    pub fn with_id(
        id: impl Into<String>,
        destination: Destination,
        body: impl Into<Vec<u8>>,
    ) -> Message {
        Message {
            id: id.into(),
            destination,
            headers: Vec::new(),
            body: body.into(),
            ordering_key: None,
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Message {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the ordering key.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Message {
        self.ordering_key = Some(key.into());
        self
    }

    /// Checks what the outbox stores: ids, keys and destinations of 1 to
    /// [`MAX_ID_LEN`] bytes without NUL (which PostgreSQL text cannot hold).
    pub fn validate(&self) -> Result<()> {
        check("message id", &self.id)?;
        let (destination, routing_key) = self.destination.columns();
        check("destination", destination).or_else(|e| {
            // The default exchange is named by the empty string.
            if destination.is_empty() && routing_key.is_some() {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        if let Some(key) = routing_key
            && (key.len() > MAX_ID_LEN || key.contains('\0'))
        {
            return Err(Error::invalid("routing key", "over 512 bytes or NUL"));
        }
        if let Some(key) = &self.ordering_key {
            check("ordering key", key)?;
        }
        for (name, value) in &self.headers {
            check("header name", name)?;
            if value.contains('\0') {
                return Err(Error::invalid(
                    "header value",
                    format!("{name}: contains NUL"),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn headers_json(&self) -> String {
        serde_json::to_string(&self.headers).expect("string pairs serialise")
    }

    pub(crate) fn headers_from_json(json: &str) -> Result<Vec<(String, String)>> {
        serde_json::from_str(json).map_err(|e| Error::invalid("stored headers", e.to_string()))
    }
}

fn check(what: &'static str, value: &str) -> Result<()> {
    if value.is_empty() {
        Err(Error::invalid(what, "empty"))
    } else if value.len() > MAX_ID_LEN {
        Err(Error::invalid(
            what,
            format!("{} bytes, more than {MAX_ID_LEN}", value.len()),
        ))
    } else if value.contains('\0') {
        Err(Error::invalid(what, "contains NUL"))
    } else {
        Ok(())
    }
}

/// A staged message as the relay reads it: the message, its place in the table and
/// how often publishing it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedMessage {
    /// Its sequence number: the order of staging (commit order may differ).
    pub seq: i64,
    /// The message.
    pub message: Message,
    /// Failed publish attempts so far.
    pub attempts: u32,
    /// When it was staged, in milliseconds since the Unix epoch.
    pub staged_at_ms: i64,
}

/// A parked message: the broker refused it for good (or it ran out of attempts). It is
/// kept, with the reason, until [`Outbox::requeue`](crate::Outbox::requeue) or a
/// person deletes it; it no longer holds back the messages of its ordering key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedMessage {
    /// The message.
    pub message: Message,
    /// Why it was parked.
    pub error: String,
    /// Failed attempts.
    pub attempts: u32,
    /// When it was parked, in milliseconds since the Unix epoch.
    pub parked_at_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_keys_and_destinations_are_bounded_and_nul_free() {
        let ok = Message::with_id("m-1", Destination::subject("orders.created"), "{}")
            .ordering_key("order-1")
            .header("content-type", "application/json");
        assert!(ok.validate().is_ok());
        assert!(
            Message::with_id("m", Destination::exchange("", "q"), "")
                .validate()
                .is_ok()
        );
        for bad in [
            Message::with_id("", Destination::subject("s"), ""),
            Message::with_id("a\0", Destination::subject("s"), ""),
            Message::with_id("m", Destination::subject(""), ""),
            Message::with_id("m", Destination::subject("s"), "").ordering_key(""),
            Message::with_id("x".repeat(MAX_ID_LEN + 1), Destination::subject("s"), ""),
        ] {
            assert!(
                matches!(bad.validate(), Err(Error::Invalid { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn headers_round_trip_through_json() {
        let m = Message::new(Destination::subject("s"), "")
            .header("a", "1")
            .header("b", "2");
        assert_eq!(
            Message::headers_from_json(&m.headers_json()).unwrap(),
            m.headers
        );
    }

    #[test]
    fn destinations_round_trip_through_their_columns() {
        for d in [Destination::subject("s"), Destination::exchange("x", "k")] {
            let (a, b) = d.columns();
            assert_eq!(
                Destination::from_columns(a.to_owned(), b.map(str::to_owned)),
                d
            );
        }
    }
}
