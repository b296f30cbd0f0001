//! WebSocket upgrades of unkeyed requests: offered to the upstream, and on its
//! `101 Switching Protocols` the two connections joined into a byte tunnel.

use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, Version};

use super::headers::{connection_options, strip_hop_by_hop};

/// The protocol an HTTP/1.1 request asks to switch to, when it is WebSocket: its
/// `Upgrade` header, when its `Connection` header names `upgrade`.
///
/// Only WebSocket: a tunnel is opaque to the gateway, and a protocol that carries HTTP
/// requests of its own (`h2c`, or TLS by RFC 2817) would let a client send them to the
/// upstream past the idempotency layer. WebSocket messages are not HTTP requests.
pub(super) fn requested_upgrade(headers: &HeaderMap) -> Option<HeaderValue> {
    let asked = connection_options(headers).any(|token| token.eq_ignore_ascii_case("upgrade"));
    (asked && upgrades_to_websocket(headers)).then(|| headers[header::UPGRADE].clone())
}

/// Whether `headers` (a request's, or a `101`'s) name WebSocket in `Upgrade`, the only
/// upgrade the gateway offers and accepts.
pub(super) fn upgrades_to_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("websocket"))
}

/// The upstream's `101 Switching Protocols`, passed on to the client with its `Upgrade`
/// header, while a task of its own joins the two connections once both have switched,
/// and copies bytes both ways until either side closes; counted open (`open`) until
/// then.
pub(super) fn switch_protocols<B: Default>(
    mut res: Response<hyper::body::Incoming>,
    client_side: hyper::upgrade::OnUpgrade,
    client_version: Version,
    open: impl Send + 'static,
) -> Response<B> {
    let upstream_side = hyper::upgrade::on(&mut res);
    let (mut parts, _) = res.into_parts();
    let protocol = parts.headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Some(protocol) = protocol {
        parts.headers.insert(header::UPGRADE, protocol);
    }
    parts.version = client_version;
    tokio::spawn(async move {
        let (client, upstream) = match tokio::try_join!(client_side, upstream_side) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(error = %e, "a connection upgrade did not complete");
                return;
            }
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut upstream = hyper_util::rt::TokioIo::new(upstream);
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((sent, received)) => {
                tracing::debug!(sent, received, "an upgraded connection closed");
            }
            Err(e) => tracing::debug!(error = %e, "an upgraded connection broke off"),
        }
        drop(open);
    });
    Response::from_parts(parts, B::default())
}
