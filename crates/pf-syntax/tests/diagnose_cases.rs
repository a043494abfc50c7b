//! Runs every case folder in `tests/diagnose/`: `prompt.md` is checked with
//! `pf_syntax::diagnose`, and the result must match
//! - `expected.txt`: one line per diagnostic, `severity Kind LINE:COL message`
//!   (`-` when unlocated), then indented `help:` / `note:` lines;
//! - `rendered.txt`: every diagnostic through `render_diagnostic` (no colour),
//!   the snapshot of what a user sees.
//!
//! Each case also asserts that the first error equals what `parse` returns.
//! `PF_BLESS=1` rewrites both files from the current output (review the diff).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use pf_syntax::{diagnose, parse, render_diagnostic, Diagnostics};
use std::fs;
use std::path::Path;

fn listing(diagnostics: &Diagnostics) -> String {
    let mut out = String::new();
    for d in diagnostics {
        let location = match (d.line, d.column) {
            (Some(line), Some(column)) => format!("{line}:{column}"),
            _ => "-".to_string(),
        };
        out.push_str(&format!(
            "{} {} {} {}\n",
            d.severity.as_str(),
            d.kind.as_str(),
            location,
            d.message
        ));
        if let Some(help) = &d.help {
            out.push_str(&format!("  help: {help}\n"));
        }
        if let Some(note) = &d.note {
            out.push_str(&format!("  note: {note}\n"));
        }
    }
    out
}

fn rendered(source: &[u8], diagnostics: &Diagnostics) -> String {
    let mut out = String::new();
    for d in diagnostics {
        out.push_str(&render_diagnostic("prompt.md", source, d, false));
        out.push_str("\n\n");
    }
    out
}

#[test]
fn diagnose_cases() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnose");
    let bless = std::env::var_os("PF_BLESS").is_some();
    let mut cases: Vec<String> = fs::read_dir(&folder)
        .expect("tests/diagnose exists")
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().is_dir())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 6,
        "expected the case set, found {}",
        cases.len()
    );

    let mut failures = Vec::new();
    for case in &cases {
        let dir = folder.join(case);
        let source = fs::read(dir.join("prompt.md")).expect("prompt.md readable");
        let diagnostics = diagnose(&source);

        let first = diagnostics.first_error().and_then(|d| d.to_parse_error());
        if let Err(error) = parse(&source) {
            if first.as_ref() != Some(&error) {
                failures.push(format!(
                    "{case}: first diagnostic {first:?} is not parse's {error:?}"
                ));
            }
        }

        for (file, actual) in [
            ("expected.txt", listing(&diagnostics)),
            ("rendered.txt", rendered(&source, &diagnostics)),
        ] {
            let path = dir.join(file);
            if bless {
                fs::write(&path, &actual).expect("write snapshot");
                continue;
            }
            let expected = fs::read_to_string(&path).unwrap_or_default();
            if expected != actual {
                failures.push(format!(
                    "{case}/{file}:\n--- expected\n{expected}--- actual\n{actual}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} problems in {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn one_line_and_json_forms() {
    let source =
        b"---\nname: t\ndescripton: d\npromptforge: 0\n---\n# T\n## A\n```lua\nx = = 1\n```\n";
    let diagnostics = diagnose(source);
    let lines: Vec<String> = diagnostics.iter().map(|d| d.one_line("p.md")).collect();
    assert_eq!(
        lines,
        [
            "p.md:3:1: Frontmatter: invalid frontmatter: unknown field `descripton`, expected one of `name`, `description`, `promptforge`, `max_tool_iterations`, `input`, `output`, `plugins`, `tools`, `args`, `models`",
            "p.md:9:5: Lua: lua compilation error at section `A` prologue (line 9): [string \"section `A` prologue\"]:1: unexpected symbol near '='",
        ]
    );
    let json = diagnostics.diagnostics[1].to_json("p.md");
    assert_eq!(json["severity"], "error");
    assert_eq!(json["kind"], "Lua");
    assert_eq!(json["file"], "p.md");
    assert_eq!(json["line"], 9);
    assert_eq!(json["column"], 5);
    assert_eq!(json["span_len"], 1);
    assert!(json.get("help").is_none());
    let typo = diagnostics.diagnostics[0].to_json("p.md");
    assert_eq!(typo["help"], "did you mean `description`?");
    let coloured = render_diagnostic("p.md", source, &diagnostics.diagnostics[0], true);
    let plain = render_diagnostic("p.md", source, &diagnostics.diagnostics[0], false);
    assert!(coloured.contains("\x1b["), "{coloured}");
    assert!(!plain.contains('\x1b'), "{plain}");
    // parse drops the Lua location (it lives in the message), as the guide says.
    let lua = diagnostics.diagnostics[1]
        .to_parse_error()
        .expect("a parse error");
    assert_eq!((lua.line, lua.column), (None, None));
}
