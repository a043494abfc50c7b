#!/usr/bin/env bash
# Installs what the tests drive for real, if absent:
#   setup.sh chromium      Debian's chromium (apt-get; needs root; tests/trace.rs)
#   setup.sh phoenix DIR   Arize Phoenix, the OTLP collector, from PyPI in a
#                          venv at DIR/phoenix (about 850 MB, a few minutes)
#   setup.sh node-mcp DIR  the MCP TypeScript SDK and the reference servers
#                          server-everything and server-filesystem, from npm
#                          into DIR/node-mcp (about 40 MB; needs Node >= 18;
#                          tests/mcp_server.rs, tests/mcp_plugins.rs)
# Safe to run concurrently and repeatedly; fails loudly when it cannot install.
set -euo pipefail
what="${1:?usage: setup.sh chromium | phoenix DIR | node-mcp DIR}"
case "$what" in
  chromium)
    command -v chromium >/dev/null && exit 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
      echo "setup.sh: chromium is missing; install it (Debian: apt-get install -y chromium)" >&2
      exit 1
    fi
    exec 9>/tmp/promptforge-apt-chromium.lock
    flock 9
    command -v chromium >/dev/null && exit 0
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    command -v chromium >/dev/null || { echo "setup.sh: chromium did not install" >&2; exit 1; }
    ;;
  phoenix)
    dir="${2:?usage: setup.sh phoenix DIR}"
    mkdir -p "$dir"
    exec 9>"$dir/.phoenix.lock"
    flock 9
    [ -f "$dir/phoenix/.ready" ] && exit 0
    command -v python3 >/dev/null || { echo "setup.sh: python3 is required for Phoenix" >&2; exit 1; }
    rm -rf "$dir/phoenix"
    python3 -m venv "$dir/phoenix"
    "$dir/phoenix/bin/pip" install -q --disable-pip-version-check "arize-phoenix==20.26.1"
    "$dir/phoenix/bin/phoenix" --help >/dev/null
    touch "$dir/phoenix/.ready"
    ;;
  node-mcp)
    dir="${2:?usage: setup.sh node-mcp DIR}"
    packages="@modelcontextprotocol/sdk@1.32.2 @modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/server-filesystem@2026.8.31"
    mkdir -p "$dir"
    exec 9>"$dir/.node-mcp.lock"
    flock 9
    [ "$(cat "$dir/node-mcp/.ready" 2>/dev/null)" = "$packages" ] && exit 0
    command -v node >/dev/null && command -v npm >/dev/null \
      || { echo "setup.sh: node and npm are required for the MCP client and server tests (Debian: apt-get install -y nodejs npm)" >&2; exit 1; }
    major="$(node -p 'process.versions.node.split(".")[0]')"
    [ "$major" -ge 18 ] || { echo "setup.sh: Node $(node --version) is too old; the MCP SDK needs Node >= 18" >&2; exit 1; }
    rm -rf "$dir/node-mcp"
    mkdir -p "$dir/node-mcp"
    echo '{"private": true}' > "$dir/node-mcp/package.json"
    # shellcheck disable=SC2086 # the list is word-split on purpose
    npm install --prefix "$dir/node-mcp" --no-audit --no-fund --silent $packages
    [ -x "$dir/node-mcp/node_modules/.bin/mcp-server-everything" ] \
      || { echo "setup.sh: the MCP npm packages did not install" >&2; exit 1; }
    echo "$packages" > "$dir/node-mcp/.ready"
    ;;
  *)
    echo "setup.sh: unknown tool $what" >&2
    exit 2
    ;;
esac
