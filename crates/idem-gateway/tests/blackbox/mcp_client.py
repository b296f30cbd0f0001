"""An unmodified MCP client (the official Python SDK) calling a tool through the
gateway with meta={"idempotency-key": key}: its first answer is lost (the call times
out while the server is slow), so it calls again with the same key; the SDK must accept
the replay, which carries the second call's own request id.

Usage: mcp_client.py URL KEY; prints one JSON line.
"""

import json
import sys

import anyio
from mcp import Client

url, key = sys.argv[1], sys.argv[2]


async def main() -> None:
    out = {}
    arguments = {"amount": 5, "slow_ms": 1500}
    async with Client(url) as client:
        try:
            await client.call_tool("pay", arguments, read_timeout_seconds=0.4, meta={"idempotency-key": key})
            out["first"] = "answered"
        except Exception as e:  # the SDK's own timeout: the answer is lost
            out["first"] = type(e).__name__
        # Past the slow execution, so that its answer is recorded.
        await anyio.sleep(2.5)
        with anyio.fail_after(10):
            retry = await client.call_tool(
                "pay", arguments, read_timeout_seconds=8, meta={"idempotency-key": key}
            )
        out["retry"] = [c.text for c in retry.content if c.type == "text"]
        out["retry_error"] = retry.is_error
        with anyio.fail_after(10):
            counted = await client.call_tool("executions", {}, read_timeout_seconds=8)
        out["executions"] = [c.text for c in counted.content if c.type == "text"]
    print(json.dumps(out))


anyio.run(main)
