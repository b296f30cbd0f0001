//! The idempotency document (SPEC S23): a small JSON document of what a client needs to
//! know to use its keys, the proxy listener serves at `--idempotency-document` to `GET`
//! and `HEAD`: the global rules and each route's, its key headers, methods, profile,
//! record lifetime (`replay_ttl_seconds`, AdCP's name for it) and the headers its
//! answers publish.
//!
//! In pass-through mode (`--passthrough`) no key is kept, and no document is served.
//!
//! It is for the clients the proxy serves, so the proxy listener serves it, and only
//! what they already meet on every answer goes in: never the upstream, the store, a
//! tenant, a limit or a secret. It is made once per configuration (a reload makes the
//! next), so serving it costs no store call.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use idem_tower::{HeaderChoice, Profile};
use serde_json::{Value, json};

use crate::config::GatewayConfig;
use crate::serve::ClientBody;

/// The document, and the path it is served at.
#[derive(Debug, Clone)]
pub(crate) struct Document {
    path: String,
    body: Bytes,
}

impl Document {
    /// The document of `config`, when it names a path for one.
    pub(crate) fn of(config: &GatewayConfig) -> Option<Document> {
        let path = config.idempotency_document.clone()?;
        let body = serde_json::to_vec(&contents(config)).expect("JSON values serialise");
        Some(Document {
            path,
            body: body.into(),
        })
    }

    /// Whether it answers `req`: a `GET` or `HEAD` of its path (the normalised one, the
    /// query ignored). Any other method there goes on to the upstream.
    pub(crate) fn answers<B>(&self, req: &Request<B>) -> bool {
        matches!(*req.method(), Method::GET | Method::HEAD) && req.uri().path() == self.path
    }

    /// The answer to `method`: the document, without its body to a `HEAD`.
    pub(crate) fn response(&self, method: &Method) -> Response<ClientBody> {
        let length = HeaderValue::from(self.body.len());
        let body = if method == Method::HEAD {
            Bytes::new()
        } else {
            self.body.clone()
        };
        let mut res = Response::new(
            Full::new(body)
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *res.status_mut() = StatusCode::OK;
        let headers = res.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::CONTENT_LENGTH, length);
        // A reload may change it.
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        res
    }
}

/// The header a retention choice comes to under `profile`, as JSON (`null` for none).
fn retention(choice: &HeaderChoice, profile: Profile) -> Value {
    choice
        .resolve(profile)
        .map_or(Value::Null, |name| name.as_str().into())
}

/// The document's JSON.
fn contents(c: &GatewayConfig) -> Value {
    let marker = |profile| {
        let name = c.replay_header.clone();
        let name = name.unwrap_or_else(|| idem_tower::replay_marker(profile));
        name.as_str().to_owned()
    };
    let methods: Vec<&str> = c.keyed_methods.iter().map(Method::as_str).collect();
    let routes: Vec<Value> = c
        .routes
        .iter()
        .map(|r| {
            let profile = r.profile.unwrap_or(c.profile);
            let choice = r.retention_header.as_ref().unwrap_or(&c.retention_header);
            let key_headers: Vec<&str> = match r.key_headers.as_slice() {
                [] => vec!["idempotency-key"],
                named => named.iter().map(|h| h.as_str()).collect(),
            };
            let methods = match &r.method {
                Some(method) => vec![method.as_str()],
                None => methods.clone(),
            };
            json!({
                "path": r.template.as_str(),
                "methods": methods,
                "key_headers": key_headers,
                "require_key": r.require_key.unwrap_or(c.require_key),
                "replay_ttl_seconds": r.ttl.unwrap_or(c.ttl).as_secs(),
                "profile": profile.as_str(),
                "retention_header": retention(choice, profile),
                "replay_header": marker(profile),
            })
        })
        .collect();
    json!({
        "methods": methods,
        "key_headers": ["idempotency-key"],
        "require_key": c.require_key,
        "replay_ttl_seconds": c.ttl.as_secs(),
        "profile": c.profile.as_str(),
        "retention_header": retention(&c.retention_header, c.profile),
        "replay_header": marker(c.profile),
        "routes": routes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RouteRule, ServeArgs};

    fn config(routes: Vec<RouteRule>) -> GatewayConfig {
        GatewayConfig::merge(
            &ServeArgs {
                upstream: Some("http://10.1.2.3:9999/secret-base".into()),
                idempotency_document: Some("/.well-known/idempotency".into()),
                admin_token: Some("admin-token-value".into()),
                ..ServeArgs::default()
            },
            ServeArgs {
                route: routes,
                ..ServeArgs::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn the_document_names_no_upstream_store_or_secret() {
        let doc = Document::of(&config(Vec::new())).unwrap();
        let text = String::from_utf8(doc.body.to_vec()).unwrap();
        for secret in [
            "10.1.2.3",
            "secret-base",
            "admin-token-value",
            "sqlite",
            "idem.db",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        let get = Request::get("/.well-known/idempotency?x=1")
            .body(())
            .unwrap();
        assert!(doc.answers(&get));
        let post = Request::post("/.well-known/idempotency").body(()).unwrap();
        assert!(!doc.answers(&post));
        let other = Request::get("/.well-known/idempotency/x").body(()).unwrap();
        assert!(!doc.answers(&other));
    }
}
