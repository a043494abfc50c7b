//! `cargo +nightly fuzz run parse`: any byte string must parse or fail cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = pf_syntax::parse(data);
});
