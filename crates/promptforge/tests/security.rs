//! What a hostile prompt or environment can do to the CLI, through the real
//! binary: the default store is private, the prompt file is capped, error
//! text cannot drive the terminal, and odd paths or a closed stdout never panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    c.env_remove("PROMPTFORGE_HOST");
    c
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

fn prompt(body: &str) -> String {
    format!("---\nname: sec\ndescription: security\npromptforge: 0\n---\n\n# Sec\n\n## Only\n\n```lua\n{body}\n```\n")
}

#[test]
fn the_default_store_is_a_fresh_private_directory_under_the_data_dir() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let p = write(
        dir.path(),
        "p.md",
        &prompt("store.write('a.txt', 'A')\nreturn 'ok'"),
    );
    let mut stores = Vec::new();
    for _ in 0..2 {
        let out = bin()
            .args(["run", "--json", "--seed", "7"])
            .arg(&p)
            .env("PROMPTFORGE_HOME", &home)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        let store = PathBuf::from(v["store"].as_str().expect("store in the report"));
        assert!(
            store.starts_with(home.join("stores")),
            "{}",
            store.display()
        );
        let mode = std::fs::metadata(&store)
            .expect("store")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "the store is private");
        assert_eq!(
            std::fs::read_to_string(store.join("a.txt")).expect("file"),
            "A"
        );
        stores.push(store);
    }
    assert_ne!(stores[0], stores[1], "the same seed never reuses a store");
}

#[test]
fn an_endless_prompt_file_is_refused_by_name() {
    let out = bin().args(["run", "/dev/zero"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/dev/zero") && err.contains("larger than 16 MiB"),
        "{err}"
    );
}

#[test]
fn control_characters_in_error_text_are_escaped_on_the_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        &prompt("error('clear \\27[2J\\rscreen', 0)"),
    );
    let out = bin()
        .arg("run")
        .arg(&p)
        .arg("--store")
        .arg(dir.path().join("s"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains('\u{1b}') && !err.contains('\r'), "{err:?}");
    assert!(err.contains("clear \\u{1b}[2J\\rscreen"), "{err}");
    // A missing file whose name holds an escape is named escaped, too.
    let out = bin()
        .args(["run", "/nonexistent\u{1b}[2J.md"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains('\u{1b}') && err.contains("\\u{1b}[2J"),
        "{err:?}"
    );
}

#[test]
fn a_non_utf8_store_path_keeps_the_result() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        &prompt("store.write('a.txt', 'A')\nreturn 'kept'"),
    );
    let store = dir.path().join(std::ffi::OsStr::from_bytes(b"st\xff\xfe"));
    for json in [true, false] {
        let mut cmd = bin();
        cmd.arg("run").arg(&p).arg("--store").arg(&store);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("run");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(text.contains("kept"), "{text}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
    assert!(store.join("a.txt").is_file());
}

#[test]
fn a_closed_stdout_never_panics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        &prompt("return string.rep('line\\n', 200000)"),
    );
    let store = dir.path().join("s");
    let store = store.to_str().expect("utf-8 temp path");
    let check = vec!["check"];
    for args in [
        vec!["run", "--store", store],
        vec!["run", "--json", "--store", store],
        check,
    ] {
        let mut child = bin()
            .args(&args)
            .arg(&p)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        drop(child.stdout.take());
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .expect("read");
        let status = child.wait().expect("wait");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_ne!(status.code(), Some(101), "{args:?}: {err}");
    }
}
