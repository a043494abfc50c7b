//! MCP servers live exactly as long as the run: started at prepare, stopped when
//! the run ends however it ends (completed, failed, cancelled mid-call), with no
//! process left behind. Drives the real binary with a test MCP server that records
//! its pid and ignores end of input, so only a real kill stops it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn server_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../pf-plugins/tests/mcp_server.py")
}

struct Setup {
    _dir: tempfile::TempDir,
    prompt: PathBuf,
    host: PathBuf,
    pid_file: PathBuf,
}

fn setup(body: &str) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let pid_file = dir.path().join("server.pid");
    let spec = json!({
        "pid_file": pid_file,
        "ignore_eof": true,
        "tools": [
            {"name": "hang", "description": "Never answers", "result": {"behaviour": "silent"}},
            {"name": "echo", "description": "Answers", "result": {"texts": ["echoed"]}}
        ]
    });
    let spec_file = dir.path().join("spec.json");
    std::fs::write(&spec_file, spec.to_string()).expect("spec");
    let host = dir.path().join("host.toml");
    let command = [
        "python3".to_string(),
        server_script().to_string_lossy().into_owned(),
        spec_file.to_string_lossy().into_owned(),
    ];
    let command: Vec<String> = command
        .iter()
        .map(|c| Value::String(c.clone()).to_string())
        .collect();
    std::fs::write(
        &host,
        format!(
            "[plugins.\"acme/life\"]\ncommand = [{}]\ntrusted = true\n",
            command.join(", ")
        ),
    )
    .expect("host");
    let prompt = dir.path().join("p.md");
    std::fs::write(
        &prompt,
        format!(
            "---\nname: life\ndescription: calls the test server\npromptforge: 0\nplugins:\n  - acme/life\ntools:\n  hang: acme/life/hang\n  echo: acme/life/echo\n---\n\n# Life\n\n## Call\n\n```lua\n{body}\n```\n"
        ),
    )
    .expect("prompt");
    Setup {
        _dir: dir,
        prompt,
        host,
        pid_file,
    }
}

fn server_pid(s: &Setup) -> Option<u32> {
    std::fs::read_to_string(&s.pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// True once no live (non-zombie) process has this pid. The 60 s deadline is
/// a liveness guard against a server never reaped, not a speed assertion.
fn gone(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
        let alive = match status {
            Ok(text) => !text
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z')),
            Err(_) => false,
        };
        if !alive {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run(s: &Setup) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("run")
        .arg(&s.prompt)
        .arg("--host")
        .arg(&s.host)
        .arg("--json")
        .output()
        .expect("run")
}

#[test]
fn the_server_stops_when_the_run_completes() {
    let s = setup("return tools.call('echo', {})");
    let out = run(&s);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["result"], "echoed", "{v}");
    let pid = server_pid(&s).expect("the server started");
    assert!(gone(pid), "server {pid} outlived a completed run");
}

#[test]
fn the_server_stops_when_the_run_fails() {
    let s = setup("tools.call('echo', {})\nerror('failing after the call')");
    let out = run(&s);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["outcome"], "failed", "{v}");
    let pid = server_pid(&s).expect("the server started");
    assert!(gone(pid), "server {pid} outlived a failed run");
}

#[test]
fn sigint_during_a_call_that_never_answers_cancels_and_stops_the_server() {
    signal_mid_call("INT");
}

#[test]
fn sigterm_during_a_call_cancels_and_stops_the_server() {
    signal_mid_call("TERM");
}

#[test]
fn sighup_during_a_call_cancels_and_stops_the_server() {
    signal_mid_call("HUP");
}

/// Send `signal` while a tool call hangs: the run reports `cancelled`, exits
/// 130, and its MCP server is gone from the process table.
fn signal_mid_call(signal: &str) {
    let s = setup("return tools.call('hang', {})");
    let mut child = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("run")
        .arg(&s.prompt)
        .arg("--host")
        .arg(&s.host)
        .arg("--json")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    while server_pid(&s).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = server_pid(&s).expect("the server started");
    // Let the call reach the server before interrupting.
    std::thread::sleep(Duration::from_millis(300));
    let kill = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("poll").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run did not stop within 30 s of SIG{signal}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["outcome"], "cancelled");
    assert!(
        gone(pid),
        "server {pid} outlived a run cancelled by SIG{signal}"
    );
}

#[test]
fn a_second_signal_exits_at_once_with_one_cancelled_report() {
    let s = setup("return tools.call('hang', {})");
    let mut child = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("run")
        .arg(&s.prompt)
        .arg("--host")
        .arg(&s.host)
        .arg("--json")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    while server_pid(&s).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server_pid(&s).is_some(), "the server started");
    std::thread::sleep(Duration::from_millis(300));
    for signal in ["-TERM", "-HUP"] {
        let kill = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(kill.success());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("poll").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run did not stop within 30 s of two signals");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reports: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(reports.len(), 1, "{stdout}");
    assert_eq!(reports[0]["outcome"], "cancelled");
    assert!(reports[0]["execution"].is_string());
    // Exiting at once skips the Plugins' shutdown; the forced exit kills the
    // server's process group itself (the server ignores end of input).
    let pid = server_pid(&s).expect("the server started");
    let stopped = gone(pid);
    if !stopped {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(
        stopped,
        "server {pid} outlived a run ended by a second signal"
    );
}
