#!/usr/bin/env bash
# Issue 40's benchmark: the queue path's overhead per run over a local batch,
# and throughput with 1, 2 and 4 workers, in one sitting.
#
#   bench/queue.sh N J [BIN]     (BIN default target/debug/promptforge)
#
# N inputs of a one-round prompt against a local OpenAI-compatible mock (the
# Rust one of crates/pf-cases/examples, so the mock is not what is measured):
#   baseline   `batch -j J` in one process, no queue
#   queue/W    `batch --queue -j N` with W workers of `-j J/W` each (J runs
#              at once in all), against a nats-server with JetStream started here
# overhead per run = CPU per run of the queue path (batch, workers and
# nats-server, user + system) - CPU per run of the local batch: the work the
# queue adds, which wall time on a shared machine hides (the queue path
# spreads its work over two processes).
# Then, with the mock holding each answer DELAY_MS (default 50: a model's
# latency), W workers of `-j J` each: throughput as workers are added.
# Needs nats-server (tests/tools/setup.sh nats).
set -euo pipefail
n="$1"; jobs="$2"; bin="${3:-target/debug/promptforge}"
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
nats_bin="$(command -v nats-server || echo /usr/sbin/nats-server)"
[ -x "$nats_bin" ] || { echo "bench/queue.sh: nats-server is missing (tests/tools/setup.sh nats)" >&2; exit 1; }
work="$(mktemp -d)"
cargo build -q -p pf-cases --example mock_openai --manifest-path "$here/../Cargo.toml"
mock="$here/../target/debug/examples/mock_openai"
pids=()
wpids=()
cleanup() {
  for p in "${wpids[@]}" "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
"$mock" > "$work/port" &
pids+=($!)
for _ in $(seq 50); do [ -s "$work/port" ] && break; sleep 0.1; done
url="http://127.0.0.1:$(head -1 "$work/port")"
cat > "$work/host.toml" <<TOML
[models.mock]
provider = "openai"
base_url = "$url/v1"
model = "mock-1"
TOML
cat > "$work/ping.md" <<'MD'
---
name: ping
description: one model round
promptforge: 0
args:
  n:
    type: integer
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
for i in $(seq "$n"); do echo "{\"n\":$i}"; done > "$work/in.jsonl"
export PROMPTFORGE_HOME="$work/home"
nats_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$nats_bin" -a 127.0.0.1 -p "$nats_port" -js -sd "$work/nats" > /dev/null 2>&1 &
nats_pid=$!
pids+=($nats_pid)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break; sleep 0.1; done
queue="nats://127.0.0.1:$nats_port"

seconds() { python3 -c "print(f'{$2 - $1:.3f}')"; }
# CPU seconds (user + system) of every waited-for child so far, and of nats-server:
# on a shared machine wall time says little, CPU per run is the overhead.
ticks=$(getconf CLK_TCK)
# `times` must run in this shell (not a $(...) subshell): snapshot() writes it.
snapshot() { times > "$work/times"; }
children_cpu() { tail -1 "$work/times" | python3 -c "import re,sys; print(sum(int(m)*60+float(s) for m,s in re.findall(r'(\d+)m([\d.]+)s', sys.stdin.read())))"; }
nats_cpu() { awk -v t="$ticks" '{print ($14 + $15) / t}' "/proc/$nats_pid/stat"; }

snapshot; cpu0=$(children_cpu)
began=$(date +%s.%N)
"$bin" batch "$work/ping.md" "$work/in.jsonl" -o "$work/local.jsonl" -j "$jobs" -q --host "$work/host.toml" 2> "$work/local.err"
ended=$(date +%s.%N)
local_s=$(seconds "$began" "$ended")
snapshot; local_cpu=$(python3 -c "print(($(children_cpu) - $cpu0) * 1000 / $n)")
echo "baseline: local batch, $n runs, -j $jobs: ${local_s} s, CPU $(printf %.2f "$local_cpu") ms a run ($(tail -1 "$work/local.err"))"

run_workers() {
  workers="$1"; per="$2"; label="$3"
  wpids=()
  for w in $(seq "$workers"); do
    "$bin" worker --queue "$queue" --host "$work/host.toml" -j "$per" --name "w$w" 2> "$work/worker$w.err" &
    wpids+=($!)
  done
  sleep 1
  snapshot; cpu0=$(children_cpu); ncpu0=$(nats_cpu)
  began=$(date +%s.%N)
  "$bin" batch "$work/ping.md" "$work/in.jsonl" -o "$work/$label$workers.jsonl" -j "$n" -q --queue "$queue" 2> "$work/queue.err"
  ended=$(date +%s.%N)
  for p in "${wpids[@]}"; do kill -TERM "$p"; done
  wait "${wpids[@]}" 2>/dev/null || true
  wpids=()
  snapshot
  queue_cpu=$(python3 -c "print(($(children_cpu) - $cpu0 + $(nats_cpu) - $ncpu0) * 1000 / $n)")
  queue_s=$(seconds "$began" "$ended")
  rate=$(python3 -c "print(f'{$n / $queue_s:.1f}')")
  line="$label/$workers: $workers worker(s) x -j $per: ${queue_s} s, $rate runs/s, CPU $(printf %.2f "$queue_cpu") ms a run (batch, workers and nats-server)"
  if [ "$label" = queue ]; then
    overhead=$(python3 -c "print(f'{$queue_cpu - $local_cpu:.2f}')")
    line="$line; overhead over the baseline: $overhead ms CPU a run"
  fi
  echo "$line"
  completed=$(grep -c '"outcome":"completed"' "$work/$label$workers.jsonl" || true)
  [ "$completed" = "$n" ] || { echo "bench/queue.sh: only $completed of $n completed" >&2; cat "$work/queue.err" >&2; exit 1; }
}
for workers in 1 2 4; do
  per=$(( jobs / workers )); [ "$per" -ge 1 ] || per=1
  run_workers "$workers" "$per" queue
done

# Scaling: a model with latency, each worker -j J.
kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
MOCK_OPENAI_DELAY_MS="${DELAY_MS:-50}" "$mock" > "$work/port2" &
pids[0]=$!
for _ in $(seq 50); do [ -s "$work/port2" ] && break; sleep 0.1; done
sed -i "s#base_url = .*#base_url = \"http://127.0.0.1:$(head -1 "$work/port2")/v1\"#" "$work/host.toml"
began=$(date +%s.%N)
"$bin" batch "$work/ping.md" "$work/in.jsonl" -o "$work/local2.jsonl" -j "$jobs" -q --host "$work/host.toml" 2> "$work/local.err"
ended=$(date +%s.%N)
echo "latency ${DELAY_MS:-50} ms, baseline: local batch -j $jobs: $(seconds "$began" "$ended") s"
for workers in 1 2 4; do
  run_workers "$workers" "$jobs" "latency"
done
