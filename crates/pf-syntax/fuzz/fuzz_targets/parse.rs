//! `cargo +nightly fuzz run parse ../tests/corpus` (from crates/pf-syntax/fuzz):
//! any byte string must parse or fail cleanly. On stable, `cargo test -p
//! pf-syntax --test fuzz_corpus` runs a bounded, seeded mutation of the same corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = pf_syntax::parse(data);
});
