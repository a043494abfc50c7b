#!/usr/bin/env bash
# The whole test suite: formatting, lints, every crate's tests, and the seed
# conformance cases through the release binary. Fails loudly on the first error.
set -euo pipefail
cd "$(dirname "$0")"
command -v cargo >/dev/null || { echo "test.sh: cargo is required (rustup.rs)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "test.sh: python3 is required (conformance runner, MCP test fixture)" >&2; exit 1; }
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== test tools (headless Chromium, Arize Phoenix)"
bash crates/promptforge/tests/tools/setup.sh chromium
bash crates/promptforge/tests/tools/setup.sh phoenix "${CARGO_TARGET_DIR:-target}/tmp/test-tools"
echo "== cargo test"
cargo test --workspace
echo "== conformance (seed)"
cargo build -p promptforge
conformance="${PROMPTFORGE_CONFORMANCE:-../shared/conformance}"
if [ -d "$conformance/seed" ]; then
  python3 "$conformance/run.py" --bin target/debug/promptforge "$conformance/seed"
else
  echo "test.sh: conformance suite not found at $conformance (set PROMPTFORGE_CONFORMANCE)" >&2
  exit 1
fi
