"""Suite check for server-memory.toml: exit 0 when memory.jsonl (in the working folder) holds a relation from
argv[1] to argv[2], whatever its wording and key order."""
import json
import sys

want_from, want_to = sys.argv[1].lower(), sys.argv[2].lower()
with open("memory.jsonl", encoding="utf-8") as f:
    for line in f:
        line = line.strip()
        if not line:
            continue
        rec = json.loads(line)
        if rec.get("type") == "relation" and rec.get("from", "").lower() == want_from \
                and rec.get("to", "").lower() == want_to:
            sys.exit(0)
print(f"no relation from {sys.argv[1]!r} to {sys.argv[2]!r} in memory.jsonl")
sys.exit(1)
