"""A bare MCP server over stdio (plain JSON-RPC, no SDK), for the draft crate's bad-input tests.

  bare_server.py --no-tools      lists no tools
  bare_server.py --slow SECS     one read-only tool, `slow_lookup`, that answers after SECS seconds

It answers `initialize` (any revision asked for), `tools/list` and `tools/call`, and refuses every other request
(`server/discover` included, so clients fall back to the initialize handshake).
"""

import json
import sys
import time

NO_TOOLS = "--no-tools" in sys.argv
SLOW = float(sys.argv[sys.argv.index("--slow") + 1]) if "--slow" in sys.argv else 0.0

TOOLS = [] if NO_TOOLS else [{
    "name": "slow_lookup",
    "description": "Look up a record by its key.",
    "inputSchema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    "annotations": {"readOnlyHint": True},
}]


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    msg = json.loads(line)
    if "id" not in msg:
        continue  # a notification
    method, rid = msg.get("method"), msg["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": msg.get("params", {}).get("protocolVersion", "2025-11-25"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "bare", "version": "0.1"},
        }})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        time.sleep(SLOW)
        key = msg.get("params", {}).get("arguments", {}).get("key", "")
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": f"record {key}: 42"}]}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"method not found: {method}"}})
