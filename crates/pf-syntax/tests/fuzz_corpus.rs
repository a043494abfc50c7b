//! The parser's fuzz run on stable, bounded and deterministic: every file in
//! `tests/corpus/` (also the seed corpus of `fuzz/`'s `parse` target) is parsed
//! as is and then under seeded random mutations and splices. Any input must
//! parse or fail cleanly, the same way every time, and `parse` and
//! `parse_detailed` must agree.
//!
//! `PF_FUZZ_ITERATIONS` (mutations per corpus file, default 400, a few seconds) and
//! `PF_FUZZ_SEED` lengthen or vary a run; `PF_FUZZ_SECONDS` keeps going, pass
//! after pass over the corpus with new seeds, for that long (CI's fixed-time
//! fuzz step, `scripts/fuzz.sh`). A failure prints the seed, pass and file so
//! it replays. Inputs that once broke the parser belong in the corpus.
//! `diagnose`'s first error must be `parse`'s error, as the `fuzz/` target checks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

/// SplitMix64: a tiny, seedable generator, so a failing case replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Fragments that matter to the grammar: fences, headings, frontmatter
/// markers, YAML structure, line ends, encodings.
const SNIPPETS: &[&[u8]] = &[
    b"\n```lua\n",
    b"\n```\n",
    b"\n```lua shared\n",
    b"\n~~~lua\n",
    b"\n---\n",
    b"\n...\n",
    b"\n# ",
    b"\n## ",
    b"\n### ",
    b"\n#### ",
    b"{#anchor}",
    b"\n- ",
    b": &a [*a, *a]",
    b": !!binary AAAA",
    b"{[",
    b"]}",
    b"\"\\u0000\"",
    b"'",
    b"\r\n",
    b"\r",
    b"\t",
    b"\xff\xfe",
    b"\xEF\xBB\xBF",
    b"\xc3\x28",
    b"\x00",
    b"<!--",
    b"-->",
    b"\n====\n",
    b"[[",
    b"]]",
    b"--[==[",
    b"{{args.x}}",
    b"{{",
    b"promptforge: 99\n",
    b"models:\n  w: {}\n",
    b"tools:\n  t: a/b/c\n",
];

fn corpus() -> Vec<(PathBuf, Vec<u8>)> {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
        .expect("tests/corpus exists")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).expect("corpus file reads");
            (path, bytes)
        })
        .collect()
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[(PathBuf, Vec<u8>)]) {
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let at = rng.below(input.len() + 1);
        match rng.below(7) {
            0 => {
                let snippet = SNIPPETS[rng.below(SNIPPETS.len())];
                input.splice(at..at, snippet.iter().copied());
            }
            1 => {
                let bytes: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
            2 => {
                let end = (at + 1 + rng.below(64)).min(input.len());
                if at < end {
                    input.drain(at..end);
                }
            }
            3 => {
                let end = (at + 1 + rng.below(64)).min(input.len());
                if at < end {
                    let copy = input[at..end].to_vec();
                    let to = rng.below(input.len() + 1);
                    input.splice(to..to, copy);
                }
            }
            4 => {
                if let Some(byte) = input.get_mut(at) {
                    *byte ^= 1 << rng.below(8);
                }
            }
            5 => {
                // Splice: a piece of another corpus file.
                let (_, other) = &corpus[rng.below(corpus.len())];
                let start = rng.below(other.len() + 1);
                let end = (start + rng.below(256)).min(other.len());
                input.splice(at..at, other[start..end].iter().copied());
            }
            _ => input.truncate(at),
        }
    }
}

/// Parses `input`, checking it parses the same way twice and that the two
/// entry points agree.
fn check(input: &[u8], context: &dyn Fn() -> String) {
    let first = pf_syntax::parse(input);
    let again = pf_syntax::parse(input);
    assert_eq!(
        format!("{first:?}"),
        format!("{again:?}"),
        "parse is not deterministic: {}",
        context()
    );
    let detailed = pf_syntax::parse_detailed(input);
    assert_eq!(
        first.is_ok(),
        detailed.is_ok(),
        "parse and parse_detailed disagree: {}",
        context()
    );
    let diagnostics = pf_syntax::diagnose(input);
    if let Err(error) = first {
        let diagnosed = diagnostics.first_error().and_then(|d| d.to_parse_error());
        assert_eq!(
            diagnosed,
            Some(error),
            "diagnose's first error is not parse's: {}",
            context()
        );
    }
    for diagnostic in &diagnostics {
        let _ = pf_syntax::render_diagnostic("fuzz.md", input, diagnostic, true);
    }
}

#[test]
fn the_corpus_and_its_seeded_mutations_parse_or_fail_cleanly() {
    let corpus = corpus();
    assert!(corpus.len() >= 40, "the corpus went missing");
    let iterations: usize = std::env::var("PF_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let seed: u64 = std::env::var("PF_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_CAFE);
    let seconds: Option<u64> = std::env::var("PF_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok());
    let started = std::time::Instant::now();
    let mut parsed_whole = 0;
    for (path, bytes) in &corpus {
        check(bytes, &|| format!("corpus file {}", path.display()));
        if pf_syntax::parse(bytes).is_ok() {
            parsed_whole += 1;
        }
    }
    let deadline = seconds.map(|s| started + std::time::Duration::from_secs(s));
    let past = || deadline.is_some_and(|d| std::time::Instant::now() >= d);
    let mut cases = 0u64;
    for pass in 0u64.. {
        // Without a time: one pass. With one: passes until it is up.
        if (pass > 0 && deadline.is_none()) || past() {
            break;
        }
        one_pass(
            &corpus,
            seed ^ (pass << 48),
            iterations,
            pass,
            &mut cases,
            &past,
        );
    }
    eprintln!(
        "{cases} mutated inputs in {:.1} s (PF_FUZZ_SEED={seed})",
        started.elapsed().as_secs_f64()
    );
    // The corpus is mostly valid prompts, so mutations start from deep inside the grammar.
    assert!(
        parsed_whole * 2 > corpus.len(),
        "{parsed_whole} of {}",
        corpus.len()
    );
}

/// One pass over the corpus: `iterations` seeded mutations of each file
/// (cut short once `past()`, the fixed time of a timed run, says so).
fn one_pass(
    corpus: &[(PathBuf, Vec<u8>)],
    seed: u64,
    iterations: usize,
    pass: u64,
    cases: &mut u64,
    past: &dyn Fn() -> bool,
) {
    for (index, (path, bytes)) in corpus.iter().enumerate() {
        if past() {
            return;
        }
        for iteration in 0..iterations {
            *cases += 1;
            let case_seed = seed ^ ((index as u64) << 32) ^ iteration as u64;
            let mut rng = Rng(case_seed);
            let mut input = bytes.clone();
            mutate(&mut rng, &mut input, corpus);
            check(&input, &|| {
                format!(
                    "pass {pass} (seed {seed}) file {} iteration {iteration} ({} bytes: {:?})",
                    path.display(),
                    input.len(),
                    String::from_utf8_lossy(&input[..input.len().min(200)])
                )
            });
        }
    }
}
