"""A small MCP server (the official Python SDK's MCPServer), stateless, whose `pay` tool
counts its executions: the upstream of the `mcp_sdk` black-box test.

Usage: mcp_server.py PORT json|sse
"""

import sys

import anyio
from mcp.server.mcpserver import MCPServer

port, answers = int(sys.argv[1]), sys.argv[2]
server = MCPServer("idem-test-payments")
runs = {"pay": 0}


@server.tool()
async def pay(amount: int, slow_ms: int = 0) -> str:
    """Takes a payment; slow_ms makes its answer late (counted before the wait)."""
    runs["pay"] += 1
    n = runs["pay"]
    await anyio.sleep(slow_ms / 1000)
    return f"paid {amount} (execution {n})"


@server.tool()
async def executions() -> int:
    """How many times pay ran."""
    return runs["pay"]


server.run(
    transport="streamable-http",
    host="127.0.0.1",
    port=port,
    stateless_http=True,
    json_response=answers == "json",
)
