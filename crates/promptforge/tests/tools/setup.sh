#!/usr/bin/env bash
# Installs what the trace tests drive for real (tests/trace.rs), if absent:
#   setup.sh chromium      Debian's chromium (apt-get; needs root)
#   setup.sh phoenix DIR   Arize Phoenix, the OTLP collector, from PyPI in a
#                          venv at DIR/phoenix (about 850 MB, a few minutes)
#   setup.sh mcp-filesystem DIR   @modelcontextprotocol/server-filesystem from
#                          npm into DIR/mcp-filesystem (tests/examples.rs)
# Safe to run concurrently and repeatedly; fails loudly when it cannot install.
set -euo pipefail
what="${1:?usage: setup.sh chromium | phoenix DIR | mcp-filesystem DIR}"
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
  mcp-filesystem)
    dir="${2:?usage: setup.sh mcp-filesystem DIR}/mcp-filesystem"
    mkdir -p "$dir"
    exec 9>"$dir/.lock"
    flock 9
    bin="$dir/node_modules/.bin/mcp-server-filesystem"
    [ -x "$bin" ] && exit 0
    command -v npm >/dev/null || { echo "setup.sh: npm is required for the filesystem MCP server (apt-get install -y npm)" >&2; exit 1; }
    (cd "$dir" && npm install --no-audit --no-fund --silent "@modelcontextprotocol/server-filesystem@2026.8.31")
    [ -x "$bin" ] || { echo "setup.sh: the filesystem MCP server did not install" >&2; exit 1; }
    ;;
  *)
    echo "setup.sh: unknown tool $what" >&2
    exit 2
    ;;
esac
