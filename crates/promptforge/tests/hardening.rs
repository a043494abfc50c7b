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

// ---------------------------------------------------------------------------
// MCP servers cannot hang a run: through the CLI, with pf-plugins' test server.
// ---------------------------------------------------------------------------

fn mcp_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../pf-plugins/tests/mcp_server.py")
}

/// A run of `body` against the test MCP server described by `spec`, whose
/// tool `t` is bound as `t`; `timeout` is the host file's per-call bound.
fn run_against_mcp(spec: Value, body: &str, json: bool) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec_file = write(dir.path(), "spec.json", &spec.to_string());
    let host = format!(
        "[plugins.\"acme/kit\"]\ncommand = [\"python3\", {:?}, {:?}]\ntimeout = 0.5\n",
        mcp_script().display().to_string(),
        spec_file.display().to_string()
    );
    let host = write(dir.path(), "host.toml", &host);
    let prompt = format!(
        "---\nname: mcp\ndescription: calls an MCP tool\npromptforge: 0\nplugins:\n  - acme/kit\ntools:\n  t: acme/kit/t\n---\n\n# Mcp\n\n## Only\n\n```lua\n{body}\n```\n"
    );
    let p = write(dir.path(), "p.md", &prompt);
    let mut cmd = bin();
    cmd.arg("run")
        .arg(&p)
        .arg("--host")
        .arg(&host)
        .arg("--store")
        .arg(dir.path().join("s"))
        .env("PROMPTFORGE_HOME", dir.path().join("home"));
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().expect("run");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tool_with(result: Value) -> Value {
    json!({"tools": [{"name": "t", "description": "a tool", "result": result}]})
}

#[test]
fn a_misbehaving_mcp_call_fails_the_call_and_never_hangs_the_run() {
    for behaviour in [
        "silent",
        "wrong_id",
        "garbage_only",
        "malformed",
        "no_result",
        "null_id_error",
    ] {
        let spec = tool_with(json!({"behaviour": behaviour}));
        let (code, stdout, stderr) =
            run_against_mcp(spec.clone(), "return tools.call('t', {})", true);
        assert_eq!(code, Some(1), "{behaviour}: {stdout} {stderr}");
        let report: Value = serde_json::from_str(&stdout).expect("one JSON report");
        assert_eq!(report["error"]["kind"], "Tool", "{behaviour}: {report}");
        let message = report["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("tool call failure: "),
            "{behaviour}: {message}"
        );
        assert!(
            !message.chars().any(|c| c.is_control()),
            "{behaviour}: {message:?}"
        );
        // Caught, the failure is a `tool` error value and the run goes on, the
        // session too: a second call still gets its own answer (or failure).
        let (code, stdout, _) = run_against_mcp(
            spec,
            "local ok, err = pcall(tools.call, 't', {})\nlocal again = pcall(tools.call, 't', {})\nreturn tostring(ok) .. ' ' .. err.kind .. ' ' .. tostring(again)",
            false,
        );
        assert_eq!(code, Some(0), "{behaviour}: {stdout}");
        assert_eq!(stdout, "false tool false\n", "{behaviour}");
    }
}

#[test]
fn an_mcp_server_that_cannot_initialize_fails_activation_with_its_stderr_tail() {
    for spec in [
        json!({"fail_start": true, "stderr_lines": ["boot \u{1b}[31mfailed\u{7}"]}),
        json!({"init": "wrong_id", "stderr_lines": ["boot \u{1b}[31mfailed\u{7}"]}),
        json!({"init": "garbage", "stderr_lines": ["boot \u{1b}[31mfailed\u{7}"]}),
    ] {
        let (code, stdout, stderr) = run_against_mcp(spec.clone(), "return 'never'", false);
        assert_eq!(code, Some(1), "{spec}: {stdout} {stderr}");
        assert!(
            stderr.contains("error[RequirementsUnmet]: the environment cannot satisfy this prompt:\n- missing required Plugin: acme/kit"),
            "{spec}: {stderr}"
        );
        // The notice keeps the guide's layout; the activation failure, with
        // the server's last stderr lines, is the warning logged before it
        // (no colour codes: stderr is a pipe here).
        assert!(
            stderr.contains(
                "required Plugin failed to activate: MCP server acme/kit failed to initialize"
            ),
            "{spec}: {stderr}"
        );
        assert!(
            stderr.contains("the server's stderr ended with: boot \\u{001b}[31mfailed\\u{0007}"),
            "{spec}: {stderr}"
        );
        assert!(
            !stderr.contains('\u{1b}') && !stderr.contains('\u{7}'),
            "{spec}: {stderr:?}"
        );
        let (code, stdout, _) = run_against_mcp(spec.clone(), "return 'never'", true);
        assert_eq!(code, Some(1));
        let report: Value = serde_json::from_str(&stdout).expect("one JSON report");
        assert_eq!(report["error"]["kind"], "RequirementsUnmet", "{report}");
    }
}

// ---------------------------------------------------------------------------
// Inputs read whole are capped, not only the prompt file.
// ---------------------------------------------------------------------------

#[test]
fn endless_args_on_stdin_and_an_endless_host_file_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", WRITER);
    let mut child = bin()
        .arg("run")
        .arg(&p)
        .arg("-")
        .arg("--store")
        .arg(dir.path().join("s"))
        .env("PROMPTFORGE_HOME", dir.path().join("home"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    // An endless stream: write until the reader stops reading.
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'y'; 1 << 20];
        while stdin.write_all(&chunk).is_ok() {}
    });
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read");
    let status = child.wait().expect("wait");
    writer.join().expect("writer");
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot read ARGS from stdin: more than 16 MiB"),
        "{err}"
    );

    for command in ["run", "check"] {
        let out = bin()
            .arg(command)
            .arg(&p)
            .args(["--host", "/dev/zero"])
            .env("PROMPTFORGE_HOME", dir.path().join("home"))
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {err}");
        assert!(
            err.contains("cannot read host file /dev/zero: larger than 16 MiB"),
            "{command}: {err}"
        );
    }
}

#[test]
fn a_device_among_served_or_checked_prompts_is_not_read_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("prompts");
    std::fs::create_dir(&folder).expect("folder");
    write(&folder, "writer.md", WRITER);
    std::os::unix::fs::symlink("/dev/zero", folder.join("zero.md")).expect("symlink");
    let out = bin()
        .arg("check")
        .arg(&folder)
        .env("PROMPTFORGE_HOME", dir.path().join("home"))
        .output()
        .expect("check");
    assert_ne!(out.status.code(), Some(101), "{out:?}");
    let out = bin()
        .arg("check")
        .arg(folder.join("zero.md"))
        .env("PROMPTFORGE_HOME", dir.path().join("home"))
        .output()
        .expect("check");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("larger than 16 MiB"));
}

#[test]
fn check_escapes_control_characters_a_prompt_put_in_its_problems() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: c\ndescription: c\npromptforge: 0\n---\n\n# C\n\n## A\u{1b}[2J\u{7}\n\nx\n\n## A\u{1b}[2J\u{7}\n\nx\n",
    );
    let out = bin().arg("check").arg(&p).output().expect("check");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(text.contains("`A\\u{1b}[2J\\u{7}`"), "{text}");
    // JSON carries the text exactly, escaped the JSON way.
    let out = bin()
        .args(["check", "--json"])
        .arg(&p)
        .output()
        .expect("check");
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        report.to_string().contains("A\\u001b[2J\\u0007"),
        "{report}"
    );
}
