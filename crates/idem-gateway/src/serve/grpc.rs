//! The gateway's own answers to gRPC clients (SPEC S18): the problems the front and the
//! proxy answer with outside the layer (an invalid path, an unreachable upstream for an
//! unkeyed call) reach a gRPC client as gRPC errors, as the layer's own already do.

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};
use idem_tower::{Problem, ProblemKind, is_grpc};

use crate::serve::ClientBody;

/// `res` as a gRPC error when it is one of the gateway's own problems and the request
/// was a gRPC call (`grpc`); else `res` as it is.
pub(super) async fn own_answer(grpc: bool, res: Response<ClientBody>) -> Response<ClientBody> {
    let Some(&kind) = res.extensions().get::<ProblemKind>() else {
        return res;
    };
    if !grpc || is_grpc(res.headers()) {
        return res;
    }
    let (head, body) = res.into_parts();
    // A problem body is a small buffer: its detail is the gRPC message's.
    let detail = match body.collect().await {
        Ok(collected) => serde_json::from_slice::<serde_json::Value>(&collected.to_bytes())
            .ok()
            .and_then(|v| v["detail"].as_str().map(str::to_owned)),
        Err(_) => None,
    };
    let problem = Problem::new(kind, detail.unwrap_or_else(|| kind.title().to_owned()));
    let mut answer = problem.to_grpc_response();
    *answer.extensions_mut() = head.extensions;
    answer.map(|b: Bytes| Full::new(b).map_err(|never| match never {}).boxed_unsync())
}
