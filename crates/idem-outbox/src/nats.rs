//! `NatsPublisher`: JetStream publishes with `Nats-Msg-Id`, acknowledgements awaited.

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;

use crate::{Destination, Message, Publish, PublishError};

/// Publishes to NATS JetStream: each message with `Nats-Msg-Id` set to its id, so the
/// stream's duplicate window drops a republish by a relay that died before marking, and
/// the stream's publish acknowledgement awaited before the relay marks it.
///
/// Refused for good (parked): a message larger than the server's `max_payload`, a
/// subject no stream captures, an [`Destination::Exchange`] (NATS has none).
#[derive(Debug, Clone)]
pub struct NatsPublisher {
    js: Context,
}

impl NatsPublisher {
    /// A publisher on `js`.
    pub fn new(js: Context) -> NatsPublisher {
        NatsPublisher { js }
    }

    async fn send(
        &self,
        message: &Message,
    ) -> Result<async_nats::jetstream::context::PublishAckFuture, PublishError> {
        let Destination::Subject(subject) = &message.destination else {
            return Err(PublishError::Refused(
                "an AMQP exchange destination cannot be published to NATS".into(),
            ));
        };
        let mut headers = HeaderMap::new();
        for (name, value) in &message.headers {
            headers.append(name.as_str(), value.as_str());
        }
        let size = message.body.len()
            + message
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 4)
                .sum::<usize>();
        let max = self.js.client().server_info().max_payload;
        if max > 0 && size > max {
            return Err(PublishError::Refused(format!(
                "{size} bytes, over the server's max_payload of {max}"
            )));
        }
        self.js
            .send_publish(
                subject.clone(),
                PublishMessage::build()
                    .headers(headers)
                    .payload(message.body.clone().into())
                    .message_id(message.id.as_str()),
            )
            .await
            .map_err(classify)
    }
}

fn classify(e: async_nats::jetstream::context::PublishError) -> PublishError {
    match e.kind() {
        PublishErrorKind::StreamNotFound => {
            PublishError::Refused(format!("no stream captures this subject ({e})"))
        }
        PublishErrorKind::MaxPayloadExceeded => PublishError::Refused(e.to_string()),
        _ => PublishError::Transient(e.to_string()),
    }
}

impl Publish for NatsPublisher {
    async fn publish_all<'a>(
        &'a self,
        messages: &'a [&'a Message],
    ) -> Vec<Result<(), PublishError>> {
        // All sent first (one connection keeps their order), then every ack awaited.
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            pending.push(self.send(message).await);
        }
        let mut results = Vec::with_capacity(messages.len());
        for sent in pending {
            results.push(match sent {
                Ok(ack) => ack.await.map(drop).map_err(classify),
                Err(e) => Err(e),
            });
        }
        results
    }
}
