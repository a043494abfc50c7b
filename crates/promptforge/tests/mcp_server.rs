#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `promptforge mcp` driven by the official MCP Python SDK client (`mcp` from
//! PyPI) over stdio and streamable HTTP. The client scenarios live in
//! `tests/mcp_client/scenarios.py`; the prompts they serve in
//! `tests/mcp_client/prompts/`. The virtualenv is built once under the
//! target directory; if it cannot be built the test fails, because CI must
//! be able to install it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

const BIN: &str = env!("CARGO_BIN_EXE_promptforge");

fn client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client")
}

/// The venv's python, with the pinned `mcp` installed (built once, then reused).
fn venv_python() -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mcp-client-venv");
    let python = venv.join("bin/python");
    let requirements = client_dir().join("requirements.txt");
    let stamp = venv.join("installed-requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).expect("read requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) && python.exists() {
        return python;
    }
    let _ = std::fs::remove_dir_all(&venv);
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 must be installed to run the MCP client tests");
    assert!(made.success(), "python3 -m venv {} failed", venv.display());
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "-r"])
        .arg(&requirements)
        .status()
        .expect("run pip");
    assert!(
        installed.success(),
        "pip install -r {} failed: the MCP Python SDK is needed for these tests",
        requirements.display()
    );
    std::fs::write(&stamp, wanted).expect("write the venv stamp");
    python
}

/// A fresh copy of the test prompts (scenarios add files to it).
fn prompts_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_tree(&client_dir().join("prompts"), dir.path());
    dir
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read prompts") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

fn run_client(python: &Path, args: &[&str]) {
    let home = tempfile::tempdir().expect("tempdir");
    run_client_in(python, args, home.path());
}

/// The client, and so the server it starts, with its run log under `home`.
fn run_client_in(python: &Path, args: &[&str], home: &Path) {
    run_script_in(python, "scenarios.py", args, home);
}

/// One of the client scripts in tests/mcp_client, with the run log under `home`.
fn run_script_in(python: &Path, script: &str, args: &[&str], home: &Path) {
    let output = Command::new(python)
        .arg(client_dir().join(script))
        .args(args)
        .env("PROMPTFORGE_HOME", home)
        .output()
        .expect("run the client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "client {args:?} failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    println!("{stdout}");
}

#[test]
fn the_python_sdk_drives_the_server_over_stdio() {
    let python = venv_python();
    let prompts = prompts_copy();
    // The log sits outside the folder the server watches.
    let logs = tempfile::tempdir().expect("tempdir");
    let errlog = logs.path().join("server-stderr.log");
    let home = tempfile::tempdir().expect("tempdir");
    run_client_in(
        &python,
        &[
            "stdio",
            BIN,
            &prompts.path().display().to_string(),
            &errlog.display().to_string(),
        ],
        home.path(),
    );
    // Every call was a run in the run log, completed and failed ones alike.
    let listed = Command::new(BIN)
        .args(["runs", "--json", "-n", "100"])
        .env("PROMPTFORGE_HOME", home.path())
        .output()
        .expect("runs");
    let runs: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("runs --json");
    let outcomes: Vec<&str> = runs
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|run| run["outcome"].as_str())
        .collect();
    assert!(outcomes.contains(&"completed"), "{runs}");
    assert!(outcomes.contains(&"failed"), "{runs}");
    let log = std::fs::read_to_string(&errlog).expect("server stderr");
    assert!(
        log.contains("broken.md:7:11: Frontmatter: invalid frontmatter: unknown variant `integre`"),
        "the left-out file is named with its line and column:\n{log}"
    );
    assert!(
        log.contains("dup-b.md: tool name `dup` is taken by") && log.contains("served as `dup_2`"),
        "the name collision is reported:\n{log}"
    );
    assert!(
        log.contains("spin: cancelled by the client"),
        "cancel reached the run:\n{log}"
    );
}

/// The wire and the process, over stdio: ping before initialize, discover,
/// unknown methods, malformed and oversized lines (the session goes on), and a
/// client killed mid-call (its run ends cancelled in the log).
#[test]
fn stdio_protocol_edges_and_a_killed_client() {
    let python = venv_python();
    let prompts = prompts_copy();
    let home = tempfile::tempdir().expect("tempdir");
    run_script_in(
        &python,
        "protocol.py",
        &["stdio", BIN, &prompts.path().display().to_string()],
        home.path(),
    );
}

/// The same over HTTP, plus the body limit, the Host and Origin checks,
/// clients gone mid-call, --call-timeout and SIGTERM under load.
#[test]
fn http_protocol_edges_vanished_clients_timeouts_and_sigterm() {
    let python = venv_python();
    let prompts = prompts_copy();
    let home = tempfile::tempdir().expect("tempdir");
    run_script_in(
        &python,
        "protocol.py",
        &["http", BIN, &prompts.path().display().to_string()],
        home.path(),
    );
}

/// The MCP TypeScript SDK from npm (tests/tools/setup.sh node-mcp; test.sh
/// runs it first), installed once under the target directory.
fn node_mcp_dir() -> PathBuf {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    let tools = Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-tools");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/setup.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg("node-mcp")
        .arg(&tools)
        .status()
        .expect("run tests/tools/setup.sh");
    assert!(
        status.success(),
        "tests/tools/setup.sh node-mcp failed: the TypeScript SDK tests need Node >= 18 and npm (see test.sh)"
    );
    tools.join("node-mcp")
}

fn run_ts_client(args: &[&str], home: &Path) {
    let node_dir = node_mcp_dir();
    let output = Command::new("node")
        .arg(client_dir().join("ts_client.mjs"))
        .arg(&node_dir)
        .args(args)
        .env("PROMPTFORGE_HOME", home)
        .output()
        .expect("node must be installed to run the TypeScript SDK tests");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "TypeScript client {args:?} failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    for scenario in [
        "list",
        "call_and_progress",
        "seeds",
        "unknown_method",
        "cancel",
    ] {
        assert!(stdout.contains(&format!("ok {scenario}\n")), "{stdout}");
    }
}

/// The TypeScript SDK's client over stdio: list, call with progress, seeds
/// exact as JavaScript numbers, an unknown method, and an abort that frees
/// the one run slot.
#[test]
fn the_typescript_sdk_drives_the_server_over_stdio() {
    let prompts = prompts_copy();
    let home = tempfile::tempdir().expect("tempdir");
    run_ts_client(
        &["stdio", BIN, &prompts.path().display().to_string()],
        home.path(),
    );
}

/// The same over streamable HTTP.
#[test]
fn the_typescript_sdk_drives_the_server_over_streamable_http() {
    let prompts = prompts_copy();
    let home = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .arg("mcp")
        .arg(prompts.path())
        .args([
            "--http",
            "127.0.0.1:0",
            "--max-concurrent",
            "1",
            "--queue",
            "4",
        ])
        .env("PROMPTFORGE_HOME", home.path())
        .env("PROMPTFORGE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("the server printed its address")
            .expect("read");
        if let Some(rest) = line.strip_prefix("promptforge mcp: listening on ") {
            break rest.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let server = HttpServer { child, url };
    run_ts_client(&["http", &server.url], home.path());
}

/// A server on `127.0.0.1:0`, and the URL it printed.
struct HttpServer {
    child: Child,
    url: String,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_http(prompts: &Path, token: &str) -> HttpServer {
    let mut child = Command::new(BIN)
        .arg("mcp")
        .arg(prompts)
        .args(["--http", "127.0.0.1:0", "--token-env", "PF_TEST_MCP_TOKEN"])
        .args(["--max-concurrent", "2", "--queue", "1"])
        .env("PF_TEST_MCP_TOKEN", token)
        .env("PROMPTFORGE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("the server printed its address")
            .expect("read");
        if let Some(rest) = line.strip_prefix("promptforge mcp: listening on ") {
            break rest.trim().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    HttpServer { child, url }
}

#[test]
fn the_python_sdk_drives_the_server_over_streamable_http_with_a_bearer_token() {
    let python = venv_python();
    let prompts = prompts_copy();
    let token = "test-token-0123456789";
    let server = start_http(prompts.path(), token);
    run_client(&python, &["auth", &server.url, token]);
    run_client(
        &python,
        &[
            "http",
            &server.url,
            token,
            &prompts.path().display().to_string(),
        ],
    );
}

#[test]
fn listening_beyond_loopback_without_a_token_is_refused() {
    let output = Command::new(BIN)
        .args(["mcp", ".", "--http", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("is reachable beyond this machine: give a bearer token"),
        "{stderr}"
    );
}

#[test]
fn a_token_variable_that_is_not_set_is_an_error() {
    let output = Command::new(BIN)
        .args([
            "mcp",
            ".",
            "--http",
            "127.0.0.1:0",
            "--token-env",
            "PF_TEST_UNSET_TOKEN",
        ])
        .env_remove("PF_TEST_UNSET_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the bearer token variable PF_TEST_UNSET_TOKEN is not set"),
        "{stderr}"
    );
}
