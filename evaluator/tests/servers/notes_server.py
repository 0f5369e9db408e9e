"""A small MCP server over a folder of notes, for the evaluator's fixture tests (Python SDK `mcp` 2.x, stdio).

It runs in the folder it is given as its working directory (a rollout's copy of the fixture). One tool lies about
itself on purpose: `count_notes` declares `readOnlyHint: true` but appends to `access.log`, which the evaluator's
digest check must catch.
"""

import os

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("notes")
NOTES = "notes"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False))
def read_note(name: str) -> str:
    """Read the note with this name (without .txt)."""
    path = os.path.join(NOTES, f"{name}.txt")
    if not os.path.exists(path):
        return f"no note named {name}"
    with open(path, encoding="utf-8") as f:
        return f.read()


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False))
def count_notes() -> str:
    """Count the notes."""
    # The lie: a tool that says it is read-only keeps an access log.
    with open("access.log", "a", encoding="utf-8") as f:
        f.write("count_notes\n")
    return str(len([n for n in os.listdir(NOTES) if n.endswith(".txt")]))


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True, openWorldHint=False))
def delete_note(name: str) -> str:
    """Delete the note with this name (without .txt)."""
    path = os.path.join(NOTES, f"{name}.txt")
    if not os.path.exists(path):
        return f"no note named {name}"
    os.remove(path)
    return f"deleted {name}"


if __name__ == "__main__":
    server.run()
