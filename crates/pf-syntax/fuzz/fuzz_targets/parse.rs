//! `cargo +nightly fuzz run parse ../tests/corpus` (from crates/pf-syntax/fuzz):
//! any byte string must parse or fail cleanly, and `diagnose` must agree with
//! `parse` on the first error. On stable, `cargo test -p pf-syntax --test
//! fuzz_corpus` runs a bounded, seeded mutation of the same corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = pf_syntax::parse(data);
    let diagnostics = pf_syntax::diagnose(data);
    if let Err(error) = parsed {
        let first = diagnostics.first_error().and_then(|d| d.to_parse_error());
        assert_eq!(first, Some(error));
    }
    for diagnostic in &diagnostics {
        let _ = pf_syntax::render_diagnostic("fuzz.md", data, diagnostic, true);
    }
});
