#!/usr/bin/env bash
# Fixed-time fuzzing, on stable Rust, from the corpora kept in the repository:
# the parser (crates/pf-syntax/tests/corpus, mutated and spliced) and the
# host functions a prompt can call (crates/pf-engine/fuzz_corpus). Each runs
# for a fixed time with a fresh seed, printed so that a failure replays:
#   PF_FUZZ_SEED=<seed> PF_FUZZ_SECONDS=<s> cargo test -p pf-syntax --test fuzz_corpus
#   PF_HOSTFUZZ_SEED=<seed> PF_HOSTFUZZ_RUNS=1 cargo test -p pf-engine --test host_fuzz
# (cargo-fuzz's libFuzzer target in crates/pf-syntax/fuzz needs nightly; this
# does not.) Called by test.sh; FUZZ_SECONDS (default 40) is each target's time.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-40}"
seed="${FUZZ_SEED:-$(date +%s)}"
echo "fuzz: ${seconds}s per target, seed $seed"
PF_FUZZ_SECONDS="$seconds" PF_FUZZ_SEED="$seed" \
  cargo test -q -p pf-syntax --test fuzz_corpus -- --nocapture
# (a failure lists every failing seed; passing seeds stay quiet)
PF_HOSTFUZZ_SECONDS="$seconds" PF_HOSTFUZZ_SEED="$seed" \
  cargo test -q -p pf-engine --test host_fuzz
