//! The run-wide memory budget through the real binary: the `[limits]
//! run_memory_mib` host-file key (its effect, and a bad value named with its
//! file, line and key), and the memory error in the terminal and `--json`
//! reports. The language side (tasks, fanout arms, nested calls) is data under
//! `tests/data/limits/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// Three sections in turn, each keeping 20 MiB until it ends: fine under the
/// default budget, too much for an 8 MiB one.
const GROWING: &str = "---\nname: grow\ndescription: keeps 20 MiB\npromptforge: 0\n---\n\n# Grow\n\n## A\n\n```lua\nvar.a = #string.rep('a', 20 * 1024 * 1024)\n```\n\n## B\n\n```lua\nlocal big = string.rep('b', 20 * 1024 * 1024)\nreturn 'kept ' .. (var.a + #big)\n```\n";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

fn run(dir: &Path, host: Option<&str>, json: bool) -> Output {
    let prompt = write(dir, "grow.md", GROWING);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    cmd.arg("run")
        .arg(&prompt)
        .arg("--store")
        .arg(dir.join("store"));
    cmd.env_remove("PROMPTFORGE_HOST")
        .env("PROMPTFORGE_HOME", dir.join("home"));
    if let Some(text) = host {
        cmd.arg("--host").arg(write(dir, "host.toml", text));
    }
    if json {
        cmd.arg("--json");
    }
    cmd.output().expect("run the binary")
}

#[test]
fn the_default_budget_leaves_an_ordinary_prompt_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(dir.path(), None, false);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept 41943040\n");
    let out = run(dir.path(), Some("[limits]\nrun_memory_mib = 512\n"), false);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn a_small_budget_fails_the_run_with_the_memory_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = "[limits]\nrun_memory_mib = 8\n";
    let out = run(dir.path(), Some(host), false);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error[Lua]: not enough memory"), "{err}");
    assert!(out.stdout.is_empty(), "no result on a failed run");

    let out = run(dir.path(), Some(host), true);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!(report["outcome"], "failed");
    assert_eq!(report["error"]["kind"], "Lua");
    assert_eq!(report["error"]["message"], "not enough memory");
}

#[test]
fn a_bad_budget_is_named_with_its_file_line_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    for bad in ["0", "-1", "1.5", "\"512MiB\"", "2000000", "true", "[1]"] {
        let host = format!("# the run budget\n[limits]\nrun_memory_mib = {bad}\n");
        let out = run(dir.path(), Some(&host), false);
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let file = dir.path().join("host.toml");
        assert!(err.contains(&file.display().to_string()), "{bad}: {err}");
        assert!(err.contains("line 3"), "{bad}: {err}");
        assert!(
            err.contains("`run_memory_mib` must be a whole number of MiB from 1 to 1048576"),
            "{bad}: {err}"
        );
        assert!(!err.contains("panicked"), "{bad}: {err}");
    }
}

#[test]
fn unknown_limits_keys_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(dir.path(), Some("[limits]\nrun_memory = 64\n"), true);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    let message = report["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("run_memory"), "{message}");
    assert!(
        message.contains("run_memory_mib"),
        "the known key is listed: {message}"
    );
}
