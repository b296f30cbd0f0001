//! The gateway's own answers (the problems the front and the proxy answer with outside
//! the layer: an invalid path, an unreachable upstream for an unkeyed call): to a gRPC
//! client as gRPC errors (SPEC S18), to any other in the gateway's profile, as the
//! layer's own answers already are.

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};
use idem_tower::{Problem, ProblemKind, Profile, is_grpc};

use crate::serve::ClientBody;

/// `res` as a gRPC error when it is one of the gateway's own problems and the request
/// was a gRPC call (`grpc`), in `profile`'s dialect when it is one written in no
/// profile yet; else `res` as it is.
pub(super) async fn own_answer(
    grpc: bool,
    profile: Profile,
    res: Response<ClientBody>,
) -> Response<ClientBody> {
    let Some(&kind) = res.extensions().get::<ProblemKind>() else {
        return res;
    };
    if is_grpc(res.headers()) {
        return res;
    }
    let written = res.extensions().get::<Profile>().copied();
    if !grpc && (written.is_some() || profile == Profile::Ietf) {
        return res;
    }
    let (head, _body) = res.into_parts();
    let problem = match head.extensions.get::<Problem>() {
        Some(problem) => problem.clone(),
        None => Problem::new(kind, kind.title()),
    };
    let mut answer = if grpc {
        problem.to_grpc_response()
    } else {
        problem.to_response_in(profile)
    };
    *answer.extensions_mut() = head.extensions;
    answer.extensions_mut().insert(profile);
    answer.map(|b: Bytes| Full::new(b).map_err(|never| match never {}).boxed_unsync())
}
