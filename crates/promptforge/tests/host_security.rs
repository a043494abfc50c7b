//! What the Host promises against hostile text, logs and servers, through the
//! real binary (issue 41): a result cannot drive the terminal, replay does not
//! trust the log, the data directory is private, and MCP Plugin processes get
//! a clean environment and never outlive the run (nor the Host).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn pf(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    c.env("PROMPTFORGE_HOME", home)
        .env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_LOG")
        .env_remove("PROMPTFORGE_MODEL")
        .stdin(Stdio::null());
    c
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

fn prompt(body: &str) -> String {
    format!("---\nname: hostsec\ndescription: host security\npromptforge: 0\n---\n\n# Host security\n\n## Only\n\n```lua\n{body}\n```\n")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ---------------------------------------------------------------------------
// 6. The terminal
// ---------------------------------------------------------------------------

/// Control sequences a fetched page or a model could put in a result: a window
/// title (OSC 0, BEL-ended), a clipboard write (OSC 52, ST-ended), clearing
/// the screen (CSI 2J), a DCS request, the one-byte C1 CSI, a carriage return
/// that overwrites the line, and a backspace.
const HOSTILE_LUA: &str =
    r#"return "A\27]0;pwned\7B\27]52;c;aGVsbG8=\27\\C\27[2JD\27P1$qm\27\\E\u{9b}2JF\rG\8H""#;
const HOSTILE: &str =
    "A\x1b]0;pwned\x07B\x1b]52;c;aGVsbG8=\x1b\\C\x1b[2JD\x1bP1$qm\x1b\\E\u{9b}2JF\rG\x08H";

/// Runs `program args` on a pseudo-terminal (python3's pty module) and returns
/// everything the terminal received, stdout and stderr alike.
fn on_a_terminal(home: &Path, args: &[&str]) -> String {
    let script = r#"
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = b""
while True:
    try:
        data = os.read(fd, 65536)
    except OSError:
        break
    if not data:
        break
    out += data
os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_promptforge"))
        .args(args)
        .env("PROMPTFORGE_HOME", home)
        .env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_LOG")
        .env("NO_COLOR", "1")
        .output()
        .expect("python3 runs the pty");
    assert!(out.status.success(), "{out:?}");
    // The Host's own progress line redraws itself (carriage return, erase
    // line); that is not text from outside.
    String::from_utf8_lossy(&out.stdout).replace("\r\u{1b}[2K", "")
}

#[test]
fn a_result_on_a_terminal_cannot_drive_it_but_a_pipe_gets_it_byte_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let p = write(dir.path(), "p.md", &prompt(HOSTILE_LUA));
    let p_arg = p.to_string_lossy().into_owned();

    // A pipe: exactly the result and its newline.
    let out = pf(&home).args(["run", &p_arg]).output().expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout, format!("{HOSTILE}\n").into_bytes());

    // A file: the same bytes.
    let file = dir.path().join("out.txt");
    let status = pf(&home)
        .args(["run", &p_arg])
        .stdout(std::fs::File::create(&file).expect("out file"))
        .status()
        .expect("run");
    assert!(status.success());
    assert_eq!(
        std::fs::read(&file).expect("read out"),
        format!("{HOSTILE}\n").into_bytes()
    );

    // A terminal: every control character shown escaped, none sent.
    let shown = on_a_terminal(&home, &["run", &p_arg]);
    for forbidden in ['\u{1b}', '\u{7}', '\u{9b}', '\u{8}'] {
        assert!(
            !shown.contains(forbidden),
            "{forbidden:?} reached the terminal: {shown:?}"
        );
    }
    // The pty turns the newline into \r\n; no other \r came through.
    assert_eq!(
        shown.matches('\r').count(),
        shown.matches("\r\n").count(),
        "{shown:?}"
    );
    for escaped in [
        "A\\u{1b}]0;pwned\\u{7}B",
        "\\u{1b}]52;c;",
        "\\u{1b}[2JD",
        "\\u{1b}P1$qm",
        "E\\u{9b}2JF\\rG\\u{8}H",
    ] {
        assert!(shown.contains(escaped), "{escaped} missing from {shown:?}");
    }

    // `show` of the logged run on a terminal escapes the result too.
    let shown = on_a_terminal(&home, &["show", "last"]);
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{9b}'),
        "{shown:?}"
    );
}

#[test]
fn a_replayed_result_on_a_terminal_is_escaped_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let p = write(dir.path(), "p.md", &prompt(HOSTILE_LUA));
    let out = pf(&home).arg("run").arg(&p).output().expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let shown = on_a_terminal(&home, &["replay", "last"]);
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{9b}'),
        "{shown:?}"
    );
    assert!(shown.contains("\\u{1b}]52;c;"), "{shown:?}");
    // Through a pipe the replay's result is the logged result, byte for byte.
    let out = pf(&home).args(["replay", "last"]).output().expect("replay");
    assert_eq!(out.stdout, format!("{HOSTILE}\n").into_bytes());
}

// ---------------------------------------------------------------------------
// 7. Replay does not trust the log
// ---------------------------------------------------------------------------

fn sqlite(db: &Path, sql: &str) {
    let out = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]); c.commit()")
        .arg(db)
        .arg(sql)
        .output()
        .expect("python3 sqlite3");
    assert!(out.status.success(), "{out:?}");
}

fn logged_run(dir: &Path, body: &str) -> (PathBuf, PathBuf) {
    let home = dir.join("home");
    let p = write(dir, "p.md", &prompt(body));
    let out = pf(&home).arg("run").arg(&p).output().expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    (home.clone(), home.join("runs.db"))
}

#[test]
fn an_edited_prompt_text_is_refused_by_replay_and_resume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (home, db) = logged_run(dir.path(), "return 'original'");
    let p = dir.path().join("p.md");
    let edits = [
        // The text changed, the hash kept: an injected line.
        "UPDATE runs SET prompt_text = replace(prompt_text, 'return ''original''', 'return os and ''escaped'' or ''edited''')",
        // One character.
        "UPDATE runs SET prompt_text = replace(prompt_text, 'original', 'originaL')",
        // The hash changed, the text kept.
        "UPDATE runs SET prompt_sha256 = '0000000000000000000000000000000000000000000000000000000000000000'",
        // Trailing whitespace only.
        "UPDATE runs SET prompt_text = prompt_text || ' '",
    ];
    for edit in edits {
        // Start each variant from an intact copy of the logged run.
        let fresh = tempfile::tempdir().expect("tempdir");
        let (home, db) = logged_run(fresh.path(), "return 'original'");
        sqlite(&db, edit);
        for args in [vec!["replay", "last"], vec!["replay", "#1", "--json"]] {
            let out = pf(&home).args(&args).output().expect("replay");
            let (stdout, stderr) = text(&out);
            assert_eq!(out.status.code(), Some(2), "{edit}: {stdout} {stderr}");
            let said = format!("{stdout}{stderr}");
            assert!(
                said.contains("does not match the prompt_sha256") && said.contains("refusing"),
                "{edit}: {said}"
            );
            assert!(!said.contains("escaped"), "{said}");
        }
        let out = pf(&home)
            .args(["run", "--resume", "last"])
            .arg(fresh.path().join("p.md"))
            .output()
            .expect("resume");
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{edit}: {stdout} {stderr}");
        assert!(
            stderr.contains("does not match the prompt_sha256"),
            "{stderr}"
        );
    }
    // The intact log still replays.
    let out = pf(&home).args(["replay", "last"]).output().expect("replay");
    assert_eq!(text(&out).0, "original\n", "{out:?}");
    let _ = (db, p);
}

#[test]
fn replay_never_opens_the_host_file_the_log_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (home, db) = logged_run(dir.path(), "return 'from the log'");
    // Paths an edited log could name: a secret whose first line an error
    // would echo, a FIFO that blocks whoever opens it, a device, a directory.
    let secret = write(dir.path(), "secret.txt", "TOP-SECRET-LINE = \"x\nmore\n");
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    for named in [
        secret.to_string_lossy().into_owned(),
        fifo.to_string_lossy().into_owned(),
        "/dev/zero".to_string(),
        "/etc".to_string(),
    ] {
        sqlite(&db, &format!("UPDATE runs SET host_file = '{named}'"));
        let mut child = pf(&home)
            .args(["replay", "#1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("replay");
        // A replay that opened the FIFO would block forever: bounded wait.
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("replay blocked on the host file the log names ({named})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("output");
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{named}: {stdout} {stderr}");
        assert_eq!(stdout, "from the log\n");
        assert!(!stderr.contains("TOP-SECRET"), "{stderr}");
    }
    // --host is still read when given.
    let host = write(dir.path(), "host.toml", "bogus = 1\n");
    let out = pf(&home)
        .args(["replay", "#1", "--host"])
        .arg(&host)
        .output()
        .expect("replay");
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("bogus"), "{stderr}");
}

// ---------------------------------------------------------------------------
// 8. The data directory
// ---------------------------------------------------------------------------

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("metadata").mode() & 0o777
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

#[test]
fn the_run_log_and_its_directory_are_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", &prompt("return 'ok'"));

    // Fresh: created private.
    let home = dir.path().join("fresh/deeper");
    let out = pf(&home).arg("run").arg(&p).output().expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(mode(&home), 0o700);
    assert_eq!(mode(&home.join("runs.db")), 0o600);
    for companion in ["runs.db-wal", "runs.db-shm"] {
        if home.join(companion).exists() {
            assert_eq!(mode(&home.join(companion)), 0o600, "{companion}");
        }
    }

    // Existing and open, ours: tightened, with no warning.
    for (dir_bits, db_bits) in [
        (0o755, 0o644),
        (0o777, 0o666),
        (0o750, 0o640),
        (0o711, 0o604),
    ] {
        let home = dir.path().join(format!("open{dir_bits:o}"));
        std::fs::create_dir(&home).expect("home");
        let out = pf(&home).arg("run").arg(&p).output().expect("run");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(dir_bits)).expect("chmod");
        std::fs::set_permissions(
            home.join("runs.db"),
            std::fs::Permissions::from_mode(db_bits),
        )
        .expect("chmod");
        let out = pf(&home).arg("run").arg(&p).output().expect("run");
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert!(!stderr.contains("warning"), "{stderr}");
        assert_eq!(mode(&home) & 0o077, 0, "dir {dir_bits:o}");
        assert_eq!(mode(&home.join("runs.db")) & 0o077, 0, "db {db_bits:o}");
        // Reading tightens too.
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(dir_bits)).expect("chmod");
        let out = pf(&home).args(["runs"]).output().expect("runs");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(mode(&home) & 0o077, 0, "dir {dir_bits:o} after runs");
    }

    // Someone else's open directory: left as it is, one warning per run.
    if !is_root() {
        eprintln!("not root: the someone-else's-directory case needs chown (CI runs as root)");
        return;
    }
    let home = dir.path().join("theirs");
    std::fs::create_dir(&home).expect("home");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let chown = Command::new("chown")
        .arg("65534")
        .arg(&home)
        .status()
        .expect("chown");
    assert!(chown.success());
    let p2 = write(dir.path(), "twice.md", &prompt("return 'ok'"));
    let out = pf(&home).arg("run").arg(&p2).output().expect("run");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "ok\n");
    assert_eq!(stderr.matches("warning:").count(), 1, "{stderr}");
    assert!(
        stderr.contains("can be read by other users") && stderr.contains("chmod go-rwx"),
        "{stderr}"
    );
    assert_eq!(mode(&home), 0o755, "someone else's directory is left alone");
    // The database in it is still created private.
    assert_eq!(mode(&home.join("runs.db")), 0o600);
}

// ---------------------------------------------------------------------------
// 5. Plugin processes
// ---------------------------------------------------------------------------

/// The Python interpreter itself, not a wrapper (a pyenv shim is a shell
/// script that adds variables of its own to the server's environment).
fn python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn server_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../pf-plugins/tests/mcp_server.py")
}

struct Mcp {
    dir: tempfile::TempDir,
    prompt: PathBuf,
    host: PathBuf,
}

impl Mcp {
    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn pid(&self, name: &str) -> Option<i32> {
        std::fs::read_to_string(self.file(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn run(&self) -> Command {
        let mut c = pf(&self.dir.path().join("home"));
        c.arg("run")
            .arg(&self.prompt)
            .arg("--host")
            .arg(&self.host)
            .arg("--json");
        c
    }
}

/// A stdio server that records its environment and pids, and starts a helper
/// (`sleep 600`) in its own process group, which would outlive the run.
fn mcp(body: &str, extra_host: &str, spec_extra: Value) -> Mcp {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = json!({
        "pid_file": dir.path().join("server.pid"),
        "helper_pid_file": dir.path().join("helper.pid"),
        "env_file": dir.path().join("env.json"),
        "tools": [
            {"name": "hang", "description": "Never answers", "result": {"behaviour": "silent"}},
            {"name": "echo", "description": "Answers", "result": {"texts": ["echoed"]}},
            {"name": "leak", "description": "Echoes a variable",
             "result": {"texts": ["key={{ENV:PASSED_KEY}}"]}}
        ]
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    let spec_file = write(dir.path(), "spec.json", &spec.to_string());
    let command = [
        python(),
        server_script().to_string_lossy().into_owned(),
        spec_file.to_string_lossy().into_owned(),
    ]
    .map(|c| Value::String(c).to_string())
    .join(", ");
    let host = write(
        dir.path(),
        "host.toml",
        &format!("[plugins.\"acme/life\"]\ncommand = [{command}]\ntrusted = true\n{extra_host}"),
    );
    let prompt = write(
        dir.path(),
        "p.md",
        &format!(
            "---\nname: life\ndescription: calls the test server\npromptforge: 0\nplugins:\n  - acme/life\ntools:\n  hang: acme/life/hang\n  echo: acme/life/echo\n  leak: acme/life/leak\n---\n\n# Life\n\n## Call\n\n```lua\n{body}\n```\n"
        ),
    );
    Mcp { dir, prompt, host }
}

/// True once no live (non-zombie) process has this pid (a 60 s liveness guard).
fn gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map(|s| {
                !s.lines()
                    .any(|l| l.starts_with("State:") && l.contains('Z'))
            })
            .unwrap_or(false);
        if !alive {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kill_leftover(pid: Option<i32>) {
    if let Some(pid) = pid {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
}

#[test]
fn a_stdio_server_gets_a_clean_environment_and_only_what_env_names() {
    let s = mcp(
        "return tools.call('leak', {})",
        "env = [\"PASSED_KEY\", \"NOT_SET_ANYWHERE\"]\n[web]\nsearch = \"brave\"\nsearch_url = \"http://127.0.0.1:9/\"\nsearch_api_key_env = \"SEARCH_KEY\"\n",
        json!({}),
    );
    let out = s
        .run()
        .env("SEARCH_KEY", "search-secret-123456")
        .env("OPENAI_API_KEY", "sk-provider-secret-123456")
        .env("AWS_SECRET_ACCESS_KEY", "aws-secret-123456")
        .env("PASSED_KEY", "passed-by-name-123456")
        .env("LC_ALL", "C.UTF-8")
        .env("LANG", "C.UTF-8")
        .output()
        .expect("run");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout} {stderr}");
    let env: Value =
        serde_json::from_str(&std::fs::read_to_string(s.file("env.json")).expect("env file"))
            .expect("env json");
    let mut names: Vec<&str> = env
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    names.sort();
    // Python itself may add LC_CTYPE when coercing the C locale; nothing else.
    let allowed = ["HOME", "LANG", "LC_ALL", "LC_CTYPE", "PASSED_KEY", "PATH"];
    for name in &names {
        assert!(
            allowed.contains(name),
            "{name} reached the server: {names:?}"
        );
    }
    for needed in ["PATH", "LANG", "LC_ALL", "PASSED_KEY"] {
        assert!(names.contains(&needed), "{needed} missing: {names:?}");
    }
    assert_eq!(env["PASSED_KEY"], "passed-by-name-123456");
    kill_leftover(s.pid("helper.pid"));
}

/// Tool names that break the tool path segment grammar (camelCase, common
/// in servers) are left out, as the seed requires, with one warning that
/// names them and says why; the other tools work (issue 42).
#[test]
fn camel_case_tool_names_are_left_out_with_a_warning_naming_them() {
    let s = mcp(
        "return tools.call('echo', {})",
        "",
        json!({"tools": [
            {"name": "hang", "description": "Never answers", "result": {"behaviour": "silent"}},
            {"name": "echo", "description": "Answers", "result": {"texts": ["echoed"]}},
            {"name": "leak", "description": "Answers", "result": {"texts": ["leaked"]}},
            {"name": "getSum", "description": "camelCase", "result": {"texts": ["3"]}},
            {"name": "readFile", "description": "camelCase", "result": {"texts": ["x"]}}
        ]}),
    );
    let out = s.run().output().expect("run");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout} {stderr}");
    assert!(stdout.contains("echoed"), "{stdout}");
    assert!(
        stderr.contains(
            "MCP server acme/life: 2 tools left out, their names cannot be a tool path segment (only lowercase a-z, 0-9, '-', '_', '.'; camelCase is not allowed): getSum, readFile"
        ),
        "{stderr}"
    );
    kill_leftover(s.pid("helper.pid"));
}

#[test]
fn check_host_checks_the_env_key() {
    for (extra, says) in [
        (
            "env = [\"1BAD\"]\n",
            "\"1BAD\" is not an environment variable name",
        ),
        (
            "env = [\"A-B\"]\n",
            "\"A-B\" is not an environment variable name",
        ),
        ("env = [\"\"]\n", "\"\" is not an environment variable name"),
        ("env = \"PATH\"\n", "env"),
    ] {
        let s = mcp("return 1", extra, json!({}));
        let out = pf(&s.dir.path().join("home"))
            .arg("check")
            .arg(&s.prompt)
            .arg("--host")
            .arg(&s.host)
            .output()
            .expect("check");
        let (stdout, stderr) = text(&out);
        assert_ne!(out.status.code(), Some(0), "{extra}: {stdout} {stderr}");
        assert!(
            format!("{stdout}{stderr}").contains(says),
            "{extra}: {stdout} {stderr}"
        );
    }
    // `env` with `url` is refused: only a server the Host starts gets variables.
    let dir = tempfile::tempdir().expect("tempdir");
    let host = write(
        dir.path(),
        "host.toml",
        "[plugins.\"acme/remote\"]\nurl = \"http://127.0.0.1:9/mcp\"\nenv = [\"PATH\"]\n",
    );
    let p = write(dir.path(), "p.md", &prompt("return 1"));
    let out = pf(&dir.path().join("home"))
        .arg("check")
        .arg(&p)
        .arg("--host")
        .arg(&host)
        .output()
        .expect("check");
    let (stdout, stderr) = text(&out);
    assert_ne!(out.status.code(), Some(0), "{stdout} {stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("needs `command`, not `url`"),
        "{stderr}"
    );
}

#[test]
fn the_servers_helpers_end_with_every_run_end() {
    for (body, outcome) in [
        ("return tools.call('echo', {})", "completed"),
        (
            "tools.call('echo', {})\nerror('failing after the call')",
            "failed",
        ),
        (
            "tools.call('echo', {})\nreturn 'no more calls'",
            "completed",
        ),
    ] {
        let s = mcp(body, "", json!({}));
        let out = s.run().output().expect("run");
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["outcome"], outcome, "{v}");
        let server = s.pid("server.pid").expect("the server started");
        let helper = s.pid("helper.pid").expect("the helper started");
        let helper_gone = gone(helper);
        kill_leftover(Some(helper));
        assert!(gone(server), "server {server} outlived a {outcome} run");
        assert!(
            helper_gone,
            "the server's helper {helper} outlived a {outcome} run"
        );
    }
}

#[test]
fn the_servers_group_dies_with_a_killed_host() {
    let s = mcp(
        "return tools.call('hang', {})",
        "",
        json!({"ignore_eof": true, "ignore_term": true}),
    );
    let mut child = s
        .run()
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run");
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.pid("helper.pid").is_none() || s.pid("server.pid").is_none() {
        assert!(Instant::now() < deadline, "the server never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let the call reach the server, then kill the Host outright (no handler runs).
    std::thread::sleep(Duration::from_millis(300));
    child.kill().expect("SIGKILL the host");
    let _ = child.wait();
    let server = s.pid("server.pid").expect("server pid");
    let helper = s.pid("helper.pid").expect("helper pid");
    let server_gone = gone(server);
    let helper_gone = gone(helper);
    kill_leftover(Some(server));
    kill_leftover(Some(helper));
    assert!(server_gone, "server {server} outlived the killed host");
    assert!(helper_gone, "helper {helper} outlived the killed host");
}
