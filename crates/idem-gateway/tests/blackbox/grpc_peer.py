"""gRPC peers for the gateway's black-box test, with grpcio's generic handlers (raw
bytes, no code generation).

    python3 grpc_peer.py serve
        Serves /shop.Orders/Create and /shop.Orders/Runs on 127.0.0.1, prints its port,
        and stops when its standard input closes.
    python3 grpc_peer.py call TARGET KEY MESSAGE [--cancel-when-running SERVER]
        One unary call to /shop.Orders/Create through TARGET with the metadata
        idempotency-key KEY (none when KEY is "-"); prints what came back as one JSON
        line. With --cancel-when-running, the call is cancelled (its stream reset) once
        SERVER's handler has started it: the answer is lost.

    python3 grpc_peer.py runs SERVER KEY
        Prints how many times SERVER's Create ran for KEY.

Create's message is "<scenario>|<payload>". The scenario says how it answers:
ok (OK, "order <n> for <payload>"), slow (the same after a second), not-found
(NOT_FOUND with details and trailing metadata), unavailable-once (UNAVAILABLE on the
first run of a key, then OK). <n> counts the runs of the call's key; /shop.Orders/Runs
answers that count for the key in its message.
"""

import base64
import json
import sys
import threading
import time
from concurrent import futures

import grpc

CREATE = "/shop.Orders/Create"
RUNS = "/shop.Orders/Runs"


def serve():
    runs = {}
    lock = threading.Lock()

    def create(request, context):
        key = dict(context.invocation_metadata()).get("idempotency-key", "")
        with lock:
            runs[key] = runs.get(key, 0) + 1
            n = runs[key]
        scenario, _, payload = request.partition(b"|")
        if scenario == b"slow":
            time.sleep(1.0)
        if scenario == b"not-found":
            context.set_trailing_metadata((("x-order-state", "gone"),))
            context.abort(grpc.StatusCode.NOT_FOUND, "no order %d" % n)
        if scenario == b"unavailable-once" and n == 1:
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        return b"order %d for %s" % (n, payload)

    def count(request, context):
        with lock:
            return str(runs.get(request.decode(), 0)).encode()

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            if details.method == CREATE:
                return grpc.unary_unary_rpc_method_handler(create)
            if details.method == RUNS:
                return grpc.unary_unary_rpc_method_handler(count)
            return None

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((Handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


def runs_of(server, key):
    with grpc.insecure_channel(server) as channel:
        return int(channel.unary_unary(RUNS)(key.encode(), timeout=10))


def metadata(pairs):
    return [[k, base64.b64encode(v).decode() if k.endswith("-bin") else v] for k, v in pairs or ()]


def call(target, key, message, cancel_server=None):
    md = () if key == "-" else (("idempotency-key", key),)
    with grpc.insecure_channel(target) as channel:
        create = channel.unary_unary(CREATE)
        if cancel_server:
            future = create.future(message.encode(), metadata=md, timeout=30)
            deadline = time.monotonic() + 20
            while runs_of(cancel_server, key) == 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            future.cancel()
            out = {"cancelled": future.cancelled(), "ran": runs_of(cancel_server, key)}
        else:
            try:
                response, state = create.with_call(message.encode(), metadata=md, timeout=30)
                out = {"code": "OK", "message": response.decode(), "details": state.details()}
            except grpc.RpcError as e:
                state = e
                out = {"code": e.code().name, "message": None, "details": e.details()}
            out["initial"] = metadata(state.initial_metadata())
            out["trailing"] = metadata(state.trailing_metadata())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    elif sys.argv[1] == "runs":
        print(runs_of(sys.argv[2], sys.argv[3]), flush=True)
    else:
        args = sys.argv[2:]
        cancel = None
        if "--cancel-when-running" in args:
            i = args.index("--cancel-when-running")
            cancel = args[i + 1]
            args = args[:i]
        call(args[0], args[1], args[2], cancel)
