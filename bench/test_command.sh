#!/usr/bin/env bash
# Issue 38's benchmark: `promptforge test` on N one-round cases against a
# local OpenAI-compatible mock (a Rust one, so the mock is not what is measured) at -j J, for each binary given, in one sitting,
# beside the bare baseline (the mock alone, driven by J client threads).
#
#   bench/test_command.sh N J BIN...
#   e.g. bench/test_command.sh 1000 16 /tmp/promptforge-main target/debug/promptforge
#
# Build every binary the same way (both debug, or both release) to compare them.
set -euo pipefail
n="$1"; jobs="$2"; shift 2
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
# The mock (crates/pf-cases/examples/mock_openai.rs), built once.
cargo build -q -p pf-cases --example mock_openai --manifest-path "$here/../Cargo.toml"
mock="$here/../target/debug/examples/mock_openai"
mock_pid=""
cleanup() { [ -n "$mock_pid" ] && kill "$mock_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
"$mock" > "$work/port" &
mock_pid=$!
for _ in $(seq 50); do [ -s "$work/port" ] && break; sleep 0.1; done
port="$(head -1 "$work/port")"
url="http://127.0.0.1:$port"
cat > "$work/host.toml" <<TOML
[models.mock]
provider = "openai"
base_url = "$url"
model = "mock-1"
TOML
cat > "$work/ping.md" <<'MD'
---
name: ping
description: one model round
promptforge: 0
models:
  w: {}
---

# Ping

## Ask

```lua
models.use('w')
return models.infer('ping')
```
MD
{
  echo "cases:"
  for i in $(seq "$n"); do
    printf '  - name: case %s\n    model: mock\n    expect:\n      result: pong\n' "$i"
  done
} > "$work/ping.test.yaml"
"$mock" --load "$n" "$jobs" "$url"
export PROMPTFORGE_HOME="$work/home"
for bin in "$@"; do
  began=$(date +%s.%N)
  summary="$("$bin" test "$work/ping.test.yaml" --host "$work/host.toml" -j "$jobs" | tail -1)"
  ended=$(date +%s.%N)
  python3 -c "import sys; s=float(sys.argv[2])-float(sys.argv[1]); print(f'{sys.argv[3]}: {sys.argv[4]} cases, -j {sys.argv[5]}: {s:.2f} s, {int(sys.argv[4])/s:.0f} cases/s ({sys.argv[6]})')" \
    "$began" "$ended" "$bin" "$n" "$jobs" "$summary"
done
