//! More angles on issue 12's classes, through the real binary: the stores of
//! `promptforge mcp` are private like the default run store, and commands
//! whose stdout closes early never panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

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

const WRITER: &str = "---\nname: writer\ndescription: writes a file to its store\npromptforge: 0\n---\n\n# Writer\n\n## Only\n\n```lua\nstore.write('a.txt', 'A')\nreturn 'written'\n```\n";

#[test]
fn the_mcp_servers_call_stores_are_private_under_the_data_dir() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let prompts = dir.path().join("prompts");
    std::fs::create_dir(&prompts).expect("prompts");
    write(&prompts, "writer.md", WRITER);
    let mut child = bin()
        .arg("mcp")
        .arg(&prompts)
        .env("PROMPTFORGE_HOME", &home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the server");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut ask = |id: u64, method: &str, params: Value| -> Value {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{line}").expect("send");
        if method == "initialize" {
            let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            // Sent after the answer is read, below.
            let answer = read_answer(&mut lines, id);
            writeln!(stdin, "{note}").expect("send");
            return answer;
        }
        read_answer(&mut lines, id)
    };
    ask(
        1,
        "initialize",
        json!({"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    );
    let tools = ask(2, "tools/list", json!({}));
    let name = tools["result"]["tools"][0]["name"]
        .as_str()
        .expect("one tool")
        .to_string();
    let called = ask(3, "tools/call", json!({"name": name, "arguments": {}}));
    assert!(called.to_string().contains("written"), "{called}");

    // While the server runs: one private root under <data>/stores, each call's
    // store private inside it; nothing in the shared temp directory.
    let stores = home.join("stores");
    let roots: Vec<PathBuf> = std::fs::read_dir(&stores)
        .expect("stores")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(roots.len(), 1, "{roots:?}");
    let root = &roots[0];
    let root_name = root.file_name().and_then(|n| n.to_str()).unwrap_or("");
    assert!(root_name.starts_with("mcp-"), "{root_name}");
    assert!(
        root_name.len() > "mcp-".len() + 12,
        "an unpredictable name: {root_name}"
    );
    let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(root), 0o700);
    let calls: Vec<PathBuf> = std::fs::read_dir(root)
        .expect("root")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(mode(&calls[0]), 0o700);
    assert_eq!(
        std::fs::read_to_string(calls[0].join("a.txt")).expect("a.txt"),
        "A"
    );
    let shared = std::env::temp_dir().join(format!("promptforge-mcp-{}", child.id()));
    assert!(!shared.exists(), "{}", shared.display());
    drop(stdin);
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
}

fn read_answer(lines: &mut std::io::Lines<BufReader<std::process::ChildStdout>>, id: u64) -> Value {
    for line in lines.by_ref() {
        let line = line.expect("a line from the server");
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v["id"] == json!(id) {
            return v;
        }
    }
    panic!("the server closed before answering {id}");
}

/// Every listing command with a closed stdout: no panic, no status 101.
#[test]
fn listing_commands_with_a_closed_stdout_never_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let p = write(dir.path(), "p.md", WRITER);
    // Something in the run log to list and show.
    for _ in 0..3 {
        let out = bin()
            .arg("run")
            .arg(&p)
            .arg("--store")
            .arg(dir.path().join("s"))
            .env("PROMPTFORGE_HOME", &home)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let file = p.to_str().expect("utf-8 temp path");
    let cases: Vec<Vec<&str>> = vec![
        vec!["runs"],
        vec!["runs", "--json"],
        vec!["show", "last"],
        vec!["show", "last", "--json"],
        vec!["show", "last", "--html"],
        vec!["info", file],
        vec!["info", file, "--json"],
        vec!["models"],
        vec!["models", "--json"],
        vec!["check", file, "--json"],
        vec!["reference"],
        vec!["completions", "bash"],
        vec!["--help"],
        vec!["test", file, "--json"],
        vec!["init", "--help"],
    ];
    for args in cases {
        let mut child = bin()
            .args(&args)
            .env("PROMPTFORGE_HOME", &home)
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
