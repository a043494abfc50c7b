//! The Host contract through the real binary: subcommands, flags, exit codes,
//! the JSON report, `check` output, host file errors and Ctrl-C.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_promptforge"))
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

const OK_PROMPT: &str = "---\nname: ok\ndescription: returns ok\npromptforge: 0\n---\n\n# Ok\n\n## Only\n\n```lua\nreturn 'ok ' .. args\n```\n";

#[test]
fn run_prints_the_result_and_exits_zero() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", OK_PROMPT);
    let out = bin()
        .arg("run")
        .arg(&p)
        .arg("there")
        .env_remove("PROMPTFORGE_HOST")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok there\n");
}

#[test]
fn json_report_has_the_contract_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", OK_PROMPT);
    let store = dir.path().join("store");
    let out = bin()
        .args(["run"])
        .arg(&p)
        .args([
            "--seed",
            "7",
            "--start",
            "2026-01-02T03:04:05Z",
            "--json",
            "--store",
        ])
        .arg(&store)
        .env_remove("PROMPTFORGE_HOST")
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["outcome"], "completed");
    assert_eq!(v["result"], "ok ");
    assert_eq!(v["seed"], 7);
    assert!(v["execution"].as_str().unwrap_or("").starts_with("run-"));
    assert!(store.is_dir());
}

#[test]
fn a_failed_run_reports_kind_and_message_and_exits_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: f\ndescription: fails\npromptforge: 0\n---\n\n# F\n\n## Only\n\n```lua\nerror('boom')\n```\n",
    );
    let out = bin()
        .arg("run")
        .arg(&p)
        .env_remove("PROMPTFORGE_HOST")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error[Lua]: section `Only` prologue:12: "),
        "{err}"
    );
    assert!(err.contains("boom"), "{err}");
    let out = bin()
        .arg("run")
        .arg(&p)
        .arg("--json")
        .env_remove("PROMPTFORGE_HOST")
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["error"]["kind"], "Lua");
}

#[test]
fn parse_failures_carry_phase_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: x\ndescription: y\npromptforge: 0\nbogus: 1\n---\n\n# T\n",
    );
    let out = bin()
        .arg("run")
        .arg(&p)
        .arg("--json")
        .env_remove("PROMPTFORGE_HOST")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["error"]["kind"], "Frontmatter");
    assert_eq!(v["error"]["phase"], "parse");
    assert!(v["error"]["line"].is_u64(), "{v}");
    assert!(v["error"]["column"].is_u64(), "{v}");
}

#[test]
fn check_is_silent_on_a_clean_file_and_names_the_problem_otherwise() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = write(dir.path(), "good.md", OK_PROMPT);
    let out = bin().arg("check").arg(&good).output().expect("check");
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    let bad = write(
        dir.path(),
        "bad.md",
        "---\nname: x\ndescription: y\npromptforge: 0\nbogus: 1\n---\n\n# T\n",
    );
    let out = bin().arg("check").arg(&bad).output().expect("check");
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("{}:5:1: Frontmatter: ", bad.display());
    assert!(text.starts_with(&prefix), "{text}");
}

#[test]
fn usage_errors_exit_two() {
    let out = bin()
        .args(["run", "/nonexistent/prompt.md"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let out = bin().args(["run"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let out = bin().args(["frobnicate"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", OK_PROMPT);
    let out = bin()
        .arg("run")
        .arg(&p)
        .args(["--start", "yesterday"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn unknown_host_file_keys_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", OK_PROMPT);
    let h = write(
        dir.path(),
        "host.toml",
        "[model]\nprovider = \"script\"\nreplies = \"r.json\"\nbogus_key = 1\n",
    );
    let out = bin()
        .arg("run")
        .arg(&p)
        .arg("--host")
        .arg(&h)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bogus_key"), "{err}");
}

#[test]
fn the_host_file_comes_from_the_environment_when_not_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", OK_PROMPT);
    let h = write(dir.path(), "host.toml", "[nonsense]\n");
    let out = bin()
        .arg("run")
        .arg(&p)
        .env("PROMPTFORGE_HOST", &h)
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(2),
        "the bad host file named by PROMPTFORGE_HOST was read"
    );
}

#[test]
fn sigint_cancels_a_busy_run_with_status_130() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: spin\ndescription: loops forever\npromptforge: 0\n---\n\n# Spin\n\n## Only\n\n```lua\nstore.write('before.txt', 'x')\nwhile true do end\n```\n",
    );
    let store = dir.path().join("store");
    let mut child = bin()
        .arg("run")
        .arg(&p)
        .arg("--json")
        .arg("--store")
        .arg(&store)
        .env_remove("PROMPTFORGE_HOST")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Wait until the run is inside its loop (the write landed), then interrupt it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.join("before.txt").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("poll").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run did not stop within 30 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["outcome"], "cancelled");
    let _ = std::io::stdout().flush();
}
