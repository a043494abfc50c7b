//! The language tests are data: every folder under `tests/data/` holding a
//! `prompt.md` and a `case.json` is one case, run through the real binary by
//! [`pf_cases`]. `UPDATE_EXPECT=1` rewrites the cases' snapshots.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use pf_cases::{Mode, Runner};

#[test]
fn every_data_case_holds() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    // `PROMPTFORGE_CASES=events` runs only the cases under `tests/data/events`.
    let root = match std::env::var("PROMPTFORGE_CASES") {
        Ok(only) if !only.is_empty() => here.join("tests/data").join(only),
        _ => here.join("tests/data"),
    };
    let runner = Runner::new(
        env!("CARGO_BIN_EXE_promptforge"),
        here.join("tests/fixtures/mcp_fixture.py"),
    );
    let summary = runner.run_all(&root, Mode::from_env());
    assert!(summary.cases > 0, "no cases under {}", root.display());
    assert!(summary.failures.is_empty(), "{summary}");
}

fn runner() -> Runner {
    Runner::new(
        env!("CARGO_BIN_EXE_promptforge"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_fixture.py"),
    )
}

const ECHO_PROMPT: &str = "---\nname: echo\ndescription: logs and returns\npromptforge: 0\n---\n\n# Echo\n\n## Only\n\n```lua\nlog('checkpoint')\nstore.write('a.txt', 'A')\nreturn 'done'\n```\n";

#[test]
fn a_misspelled_expectation_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("prompt.md"), ECHO_PROMPT).expect("prompt");
    std::fs::write(
        dir.path().join("case.json"),
        r#"{"expect": {"reslt": "done"}}"#,
    )
    .expect("case");
    let error = runner().run_case(dir.path(), Mode::Check).err();
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("unknown field `reslt`")),
        "{error:?}"
    );
}

#[test]
fn bless_rewrites_snapshots_and_keeps_assertions() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("prompt.md"), ECHO_PROMPT).expect("prompt");
    let case = dir.path().join("case.json");
    std::fs::write(
        &case,
        "{\n \"expect\": {\n  \"result\": \"stale\",\n  \"result_contains\": [\"do\"],\n  \"store\": {\"a.txt\": \"old\", \"b.txt\": \"x\"},\n  \"events\": []\n }\n}\n",
    )
    .expect("case");
    let checked = runner().run_case(dir.path(), Mode::Check).expect("runs");
    assert_eq!(checked.problems.len(), 4, "{:?}", checked.problems);

    let blessed = runner().run_case(dir.path(), Mode::Bless).expect("runs");
    assert!(blessed.blessed);
    assert!(blessed.problems.is_empty(), "{:?}", blessed.problems);
    assert_eq!(
        std::fs::read_to_string(&case).expect("case"),
        "{\n \"expect\": {\n  \"result\": \"done\",\n  \"result_contains\": [\n   \"do\"\n  ],\n  \
         \"store\": {\n   \"a.txt\": \"A\",\n   \"b.txt\": null\n  },\n  \
         \"events\": [\n   \"0.0 Prompt: parse_started\",\n   \"0.1 Only: lua_compilation_started\",\n   \"0.2 Only: lua_compilation_succeeded\",\n   \"0.3 Prompt: parse_succeeded\",\n   \"0.4 Echo: run_started\",\n   \"0.5 Only: section_started\",\n   \"0.6 Only: lua_shared_load_started\",\n   \"0.7 Only: lua_shared_load_succeeded\",\n   \"0.8 Only: lua_chunk_started\",\n   \"0.9 Only: lua {\\\"message\\\":\\\"checkpoint\\\"}\",\n   \"0.11 Only: store_write_succeeded\",\n   \"0.12 Only: lua_chunk_succeeded\",\n   \"0.13 Only: lua_teardown_started\",\n   \"0.14 Only: lua_teardown_succeeded\",\n   \"0.15 Only: section_finished\",\n   \"0.16 Echo: run_succeeded\"\n  ]\n }\n}\n"
    );

    let again = runner().run_case(dir.path(), Mode::Bless).expect("runs");
    assert!(!again.blessed, "a passing case is left as it is");
    let checked = runner().run_case(dir.path(), Mode::Check).expect("runs");
    assert!(checked.problems.is_empty(), "{:?}", checked.problems);
}

/// No case expects a line of the engine's own Lua (`[promptforge env]:71:`)
/// in a message: engine errors name the prompt's line or the engine part.
#[test]
fn no_case_expects_an_engine_line() {
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.file_name().is_some_and(|n| n == "case.json") {
                let text = std::fs::read_to_string(&path).expect("case");
                for part in [
                    "[promptforge env]:",
                    "[promptforge prelude]:",
                    "[promptforge guards]:",
                ] {
                    if text.contains(part) {
                        found.push(format!("{}: {part}", path.display()));
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data"),
        &mut found,
    );
    assert!(found.is_empty(), "{found:#?}");
}
