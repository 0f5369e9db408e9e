# Streamable HTTP fidelity of `tooltune proxy --listen --upstream` with the official Python SDK's client: tools and
# a call against the upstream directly and through the proxy; everything equal except the rewritten description.
# Usage: python fidelity_http.py DIRECT_URL PROXIED_URL TOOL   (prints a JSON report; exit 1 on a difference)
import asyncio, json, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
async def run(url):
    async with streamable_http_client(url) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            t = (await s.list_tools()).model_dump(mode="json")
            c = (await s.call_tool("search_docs", {"query": "webhook signature header"})).model_dump(mode="json")
            return t, c
async def main():
    a = await run(sys.argv[1]); b = await run(sys.argv[2])
    tool = sys.argv[3]
    ta = [{k: v for k, v in x.items() if k != "description" or x["name"] != tool} for x in a[0]["tools"]]
    tb = [{k: v for k, v in x.items() if k != "description" or x["name"] != tool} for x in b[0]["tools"]]
    report = {"call_equal": a[1] == b[1], "tools_equal_but_rewritten": ta == tb,
              "proxied": [x["description"] for x in b[0]["tools"] if x["name"] == tool]}
    print(json.dumps(report))
    if not (report["call_equal"] and report["tools_equal_but_rewritten"]):
        sys.exit(1)
asyncio.run(main())
