# Protocol fidelity of `tooltune proxy` with the official Python SDK's client: the same session (tools, resources,
# prompts, logging, progress, sampling) is run against a server directly and through the proxy, and every response
# must be identical except the descriptions the proxy was told to rewrite.
#
# Usage: python fidelity.py TOOLTUNE_BIN DB OVERRIDES_JSON -- SERVER_COMMAND...   (prints a JSON report; exit 1 on a difference)
import asyncio, json, sys
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

tooltune, db, overrides = sys.argv[1], sys.argv[2], sys.argv[3]
server = sys.argv[sys.argv.index("--") + 1:]
rewrites = json.load(open(overrides))


async def session_run(command):
    seen = {"logs": [], "progress": [], "sampling": 0}

    async def sampling(context, params):
        seen["sampling"] += 1
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="sampled"), model="fake")

    async def logging(params):
        seen["logs"].append(params.level)

    async def progress(p, total, message):
        seen["progress"].append(p)

    async def attempt(coro):
        # A server without resources or prompts answers with an error; it must be the same error on both paths.
        try:
            return (await coro).model_dump(mode="json")
        except Exception as e:  # noqa: BLE001 - the error is the observation
            return {"error": type(e).__name__, "message": str(e)}

    params = StdioServerParameters(command=command[0], args=command[1:], env={"PATH": "/usr/bin:/bin"})
    out = {}
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w, sampling_callback=sampling, logging_callback=logging) as s:
            init = await s.initialize()
            out["initialize"] = init.model_dump(mode="json")
            out["tools"] = await attempt(s.list_tools())
            names = [t["name"] for t in out["tools"]["tools"]]
            out["echo"] = await attempt(s.call_tool("echo", {"message": "hi"}))
            out["sum"] = await attempt(s.call_tool("get-sum", {"a": 2, "b": 3}))
            out["unknown_tool"] = await attempt(s.call_tool("no-such-tool", {}))
            if "trigger-long-running-operation" in names:
                out["long"] = await attempt(s.call_tool("trigger-long-running-operation", {"duration": 1, "steps": 3}, progress_callback=progress))
            if "trigger-sampling-request" in names:
                out["sampling"] = await attempt(s.call_tool("trigger-sampling-request", {"prompt": "x", "maxTokens": 5}))
            out["resources"] = await attempt(s.list_resources())
            first = (out["resources"].get("resources") or [{}])[0].get("uri")
            if first:
                out["read"] = await attempt(s.read_resource(first))
            out["prompts"] = await attempt(s.list_prompts())
            p = out["prompts"].get("prompts") or []
            if p:
                args = {a["name"]: "x" for a in (p[0].get("arguments") or []) if a.get("required")}
                out["prompt"] = await attempt(s.get_prompt(p[0]["name"], args))
            out["logging"] = await attempt(s.set_logging_level("debug"))
            out["ping"] = await attempt(s.send_ping())
    out["seen"] = seen
    return out


async def main():
    direct = await session_run(server)
    proxied = await session_run([tooltune, "--database-url", db, "proxy", "--overrides", overrides, "--record", "full", "--"] + server)
    rewritten = []
    for t in proxied["tools"]["tools"]:
        if t["name"] in rewrites:
            rewritten.append(t["name"])
            if t["description"] != rewrites[t["name"]]:
                print(json.dumps({"error": f"{t['name']} was not rewritten"})); sys.exit(1)
    for t in direct["tools"]["tools"]:
        if t["name"] in rewrites:
            t["description"] = rewrites[t["name"]]
    diffs = [k for k in direct if direct[k] != proxied.get(k)]
    print(json.dumps({"compared": sorted(direct), "rewritten": rewritten, "differences": diffs,
                      "progress": proxied["seen"]["progress"], "sampling_requests": proxied["seen"]["sampling"],
                      "log_messages": len(proxied["seen"]["logs"])}))
    if diffs:
        for k in diffs:
            print(k, json.dumps(direct[k])[:400], "\n  vs", json.dumps(proxied.get(k))[:400], file=sys.stderr)
        sys.exit(1)


asyncio.run(main())
