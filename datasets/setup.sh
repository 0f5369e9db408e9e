#!/usr/bin/env bash
# Installs the third-party MCP servers that the suites in datasets/suites/ run, into a project-local folder:
#   ${TOOLTUNE_THIRD_PARTY:-datasets/.third-party}/time/      Python virtualenv with PyPI mcp-server-time
#   ${TOOLTUNE_THIRD_PARTY:-datasets/.third-party}/node/      npm prefix with @modelcontextprotocol/server-filesystem
#                                                              @modelcontextprotocol/server-memory and
#                                                              @modelcontextprotocol/server-everything (the
#                                                              proxy's protocol-fidelity test)
# Idempotent: each part writes a stamp naming the pinned versions and is skipped while the stamp matches,
# so a second run costs milliseconds. Each Python server gets its own virtualenv because several PyPI
# servers leave `mcp` unpinned and break on other majors.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${TOOLTUNE_THIRD_PARTY:-$here/.third-party}"

# Exact pins: a fresh machine must install what the suites were written against.
MCP_SERVER_TIME_VERSION="2026.10.19"
MCP_PY_VERSION="2.3.0"            # mcp-server-time leaves `mcp` open; 2.x speaks 2026-07-28
SERVER_FILESYSTEM_VERSION="2026.8.31"
SERVER_MEMORY_VERSION="2026.8.31"
SERVER_EVERYTHING_VERSION="2026.8.31"

mkdir -p "$dest"

install_time() {
  local dir="$dest/time"
  local want="mcp-server-time==$MCP_SERVER_TIME_VERSION mcp==$MCP_PY_VERSION"
  if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$want" && -x "$dir/bin/mcp-server-time" ]]; then
    return 0
  fi
  echo "setup.sh: installing $want into $dir" >&2
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
    "mcp-server-time==$MCP_SERVER_TIME_VERSION" "mcp==$MCP_PY_VERSION"
  printf '%s' "$want" > "$dir/.stamp"
}

install_filesystem() {
  local dir="$dest/node"
  local want="@modelcontextprotocol/server-filesystem@$SERVER_FILESYSTEM_VERSION @modelcontextprotocol/server-memory@$SERVER_MEMORY_VERSION @modelcontextprotocol/server-everything@$SERVER_EVERYTHING_VERSION"
  local entry="$dir/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
  local memory="$dir/node_modules/@modelcontextprotocol/server-memory/dist/index.js"
  local everything="$dir/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
  if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$want" && -f "$entry" && -f "$memory" && -f "$everything" ]]; then
    return 0
  fi
  echo "setup.sh: installing $want into $dir" >&2
  rm -rf "$dir"
  mkdir -p "$dir"
  # shellcheck disable=SC2086 # three package specs, split on purpose
  npm install --silent --no-audit --no-fund --prefix "$dir" $want
  printf '%s' "$want" > "$dir/.stamp"
}

install_time
install_filesystem
echo "$dest"
