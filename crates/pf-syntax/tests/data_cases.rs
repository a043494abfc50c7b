//! Runs every prompt in `tests/data/`: each `NAME.md` has a `NAME.expect`
//! holding `ok`, or `Kind LINE:COL message` (`Kind - message` when the error
//! has no location). Every failure is reported at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;

fn describe(result: &Result<pf_syntax::Prompt, pf_syntax::ParseError>) -> String {
    match result {
        Ok(_) => "ok".to_string(),
        Err(error) => {
            let location = match (error.line, error.column) {
                (Some(line), Some(column)) => format!("{line}:{column}"),
                _ => "-".to_string(),
            };
            format!("{} {} {}", error.kind.as_str(), location, error.message)
        }
    }
}

#[test]
fn data_cases() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut names: Vec<String> = fs::read_dir(&folder)
        .expect("tests/data exists")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter_map(|name| name.strip_suffix(".md").map(str::to_string))
        .collect();
    names.sort();
    assert!(
        names.len() > 50,
        "expected the full case set, found {}",
        names.len()
    );

    let mut failures = Vec::new();
    for name in &names {
        let source = fs::read(folder.join(format!("{name}.md"))).expect("case readable");
        let expected = match fs::read_to_string(folder.join(format!("{name}.expect"))) {
            Ok(text) => text.trim_end_matches(['\n', '\r']).to_string(),
            Err(_) => {
                failures.push(format!("{name}: missing {name}.expect"));
                continue;
            }
        };
        let actual = describe(&pf_syntax::parse(&source));
        if actual != expected {
            failures.push(format!(
                "{name}:\n  expected: {expected}\n  actual:   {actual}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}
