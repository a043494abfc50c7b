//! A catalog model that starts its own server (`spawn`), through the real
//! binary, with a fake server script (tests/fixtures/spawn_server.py) in the
//! roles a real one plays: it starts and serves, dies early, never answers,
//! ignores SIGTERM (with a helper in its process group), answers slowly while
//! the run is stopped by SIGTERM. Every test checks that no server process
//! outlives the command.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/spawn_server.py"
);

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// A host file whose model `local` is the fake server in `mode`.
    fn new(mode: &str, extra: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = format!(
            "[models.local]\nmodel = \"fake\"\nspawn = [\"python3\", {SERVER:?}, \"{mode}\", \"{{port}}\", {:?}]\n{extra}",
            dir.path().join("starts.txt")
        );
        std::fs::write(dir.path().join("host.toml"), host).expect("host");
        std::fs::write(
            dir.path().join("p.md"),
            "---\nname: p\ndescription: asks the model once\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# P\n\n## S\n\n```lua\nmodels.use('writer')\nreturn models.infer('hi')\n```\n",
        )
        .expect("prompt");
        Fixture { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        cmd.args(args)
            .arg("--host")
            .arg(self.path("host.toml"))
            .env_remove("PROMPTFORGE_MODEL")
            .env_remove("PROMPTFORGE_HOST")
            .env("PROMPTFORGE_HOME", self.path("home"));
        cmd
    }

    fn run(&self) -> (Value, Output) {
        let out = self
            .command(&["run"])
            .arg(self.path("p.md"))
            .args(["--model", "local", "--seed", "1", "--json", "--store"])
            .arg(self.path("store"))
            .output()
            .expect("run");
        (
            serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
            out,
        )
    }

    /// Every line the fake servers appended: `start PID PORT`, `helper PID`.
    fn starts(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.path("starts.txt"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(' ').map(str::to_string).collect())
            .collect()
    }

    fn pids(&self) -> Vec<u32> {
        self.starts()
            .iter()
            .filter(|words| words[0] == "start")
            .filter_map(|words| words.get(1)?.parse().ok())
            .collect()
    }
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits a little for `pids` to be gone (an orphan is reaped by init, not at once).
fn assert_all_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<&u32> = pids.iter().filter(|p| alive(**p)).collect();
    assert!(left.is_empty(), "still running: {left:?}");
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_spawned_server_serves_the_run_on_its_port_and_stops_with_the_process() {
    // Every key variable the host file names is kept from the server but its own model's.
    let f = Fixture::new(
        "serve",
        "api_key_env = \"PF_SPAWN_TEST_OWN\"\n[models.remote]\nmodel = \"m\"\napi_key_env = \"PF_SPAWN_TEST_OTHER\"\n[web]\nsearch_api_key_env = \"PF_SPAWN_TEST_SEARCH\"\n",
    );
    let out = f
        .command(&["run"])
        .arg(f.path("p.md"))
        .args(["--model", "local", "--seed", "1", "--json", "--store"])
        .arg(f.path("store"))
        .env("PF_SPAWN_TEST_OWN", "own-key")
        .env("PF_SPAWN_TEST_OTHER", "other-key")
        .env("PF_SPAWN_TEST_SEARCH", "search-key")
        .env("PF_SPAWN_TEST_PLAIN", "not a key")
        .output()
        .expect("run");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(out.status.success(), "{}", stderr(&out));
    let starts = f.starts();
    assert_eq!(starts.len(), 2, "{starts:?}");
    assert_eq!(starts[1], ["env", "PF_SPAWN_TEST_OWN,PF_SPAWN_TEST_PLAIN"]);
    let port = &starts[0][2];
    assert_eq!(report["result"], format!("served on {port}: hi"));
    assert_eq!(report["usage"]["input_tokens"], 11);
    assert_all_gone(&f.pids());
    // The next process starts its own server.
    let again = f
        .command(&["run"])
        .arg(f.path("p.md"))
        .args(["--model", "local", "--json", "--no-log"])
        .env("PF_SPAWN_TEST_OWN", "own-key")
        .output()
        .expect("run");
    let again: Value = serde_json::from_slice(&again.stdout).unwrap_or(Value::Null);
    assert!(
        again["result"]
            .as_str()
            .unwrap_or_default()
            .starts_with("served on "),
        "{again}"
    );
    assert_eq!(f.pids().len(), 2);
    assert_all_gone(&f.pids());
}

#[test]
fn a_server_that_dies_early_fails_the_round_with_its_last_output() {
    let f = Fixture::new("die", "");
    let (report, out) = f.run();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let message = report["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("exited (exit status: 3) before it answered"),
        "{report}"
    );
    assert!(
        message.contains("fake server: error: cannot load the model file"),
        "{report}"
    );
    assert_all_gone(&f.pids());
}

#[test]
fn a_server_that_never_answers_fails_after_spawn_timeout_and_is_killed() {
    let f = Fixture::new("silent", "spawn_timeout = 1.5\n");
    let started = Instant::now();
    let (report, out) = f.run();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let message = report["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("within 1.5 s (spawn_timeout)"), "{report}");
    assert!(message.contains("listening, never answering"), "{report}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_all_gone(&f.pids());
}

#[test]
fn a_server_ignoring_sigterm_is_killed_with_its_process_group() {
    let f = Fixture::new("stubborn", "");
    let (report, out) = f.run();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(report["result"].as_str().unwrap().starts_with("served on "));
    let starts = f.starts();
    let helper: u32 = starts
        .iter()
        .find(|w| w[0] == "helper")
        .expect("helper line")[1]
        .parse()
        .unwrap();
    let mut pids = f.pids();
    pids.push(helper);
    assert_all_gone(&pids);
}

/// SIGTERM to promptforge while `mode`'s server starts or answers: the run
/// ends cancelled (130) and the server is gone.
fn sigterm_while(mode: &str, extra: &str) {
    let f = Fixture::new(mode, extra);
    let child = f
        .command(&["run"])
        .arg(f.path("p.md"))
        .args(["--model", "local", "--seed", "1", "--json", "--store"])
        .arg(f.path("store"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    // Wait for the server to start and the round to be sent.
    let deadline = Instant::now() + Duration::from_secs(20);
    while f.starts().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("report");
    assert_eq!(report["outcome"], "cancelled", "{report}");
    assert_all_gone(&f.pids());
}

#[test]
fn sigterm_mid_round_cancels_the_run_and_stops_the_server() {
    sigterm_while("slow", "");
}

#[test]
fn sigterm_while_the_server_starts_cancels_the_run_and_kills_the_server() {
    sigterm_while("silent", "spawn_timeout = 60\n");
}

/// `promptforge test` runs each case in a process of its own (for now), so
/// each run starts and stops its server; none is left behind. (Sharing within
/// one process is pf-models' `tests/spawn.rs`.)
#[test]
fn test_model_runs_against_a_spawned_server_and_leaves_none_behind() {
    let f = Fixture::new("serve", "");
    std::fs::write(
        f.path("p.test.yaml"),
        "cases:\n  - name: asks\n    expect:\n      events:\n        model_turn_completed: 1\n",
    )
    .expect("test file");
    let out = f
        .command(&["test"])
        .arg(f.path("p.test.yaml"))
        .args(["--model", "local", "--repeat", "3"])
        .output()
        .expect("test");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    assert!(!f.starts().is_empty());
    assert_all_gone(&f.pids());
}

#[test]
fn models_shows_the_command_and_check_host_finds_it() {
    let f = Fixture::new("serve", "tool_format = \"json\"\n");
    let out = f.command(&["models", "--json"]).output().expect("models");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let model = &v["models"][0];
    assert_eq!(model["spawn"][0], "python3");
    assert_eq!(model["spawn"][3], "{port}");
    assert_eq!(
        model["spawn"][4],
        f.path("starts.txt").display().to_string()
    );
    assert_eq!(model["base_url"], "http://127.0.0.1:{port}/v1");
    assert_eq!(model["tool_format"], "json");
    let text = f.command(&["models"]).output().expect("models");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("local: started by promptforge on first use: python3 "),
        "{text}"
    );
    assert!(
        text.contains("local: tool calls as JSON in the reply text"),
        "{text}"
    );
    let checked = f
        .command(&["check"])
        .arg(f.path("p.md"))
        .output()
        .expect("check");
    assert!(checked.status.success(), "{}", stderr(&checked));
    assert!(f.starts().is_empty(), "check must not start the server");

    std::fs::write(
        f.path("host.toml"),
        "[models.local]\nmodel = \"fake\"\nspawn = [\"no-such-server-binary-pf\", \"{port}\"]\n",
    )
    .expect("host");
    let missing = f
        .command(&["check"])
        .arg(f.path("p.md"))
        .output()
        .expect("check");
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing)
            .contains("model \"local\": `spawn`: `no-such-server-binary-pf` is not found in PATH"),
        "{}",
        stderr(&missing)
    );
    std::fs::write(
        f.path("host.toml"),
        "[models.local]\nmodel = \"fake\"\nspawn = [\"./server.sh\"]\n",
    )
    .expect("host");
    let relative = f
        .command(&["check"])
        .arg(f.path("p.md"))
        .output()
        .expect("check");
    assert!(
        stderr(&relative).contains("is not an executable file"),
        "{}",
        stderr(&relative)
    );
}

#[test]
fn host_file_mistakes_in_spawn_name_the_key() {
    for (extra, expected) in [
        ("spawn = []\n", "`spawn` must name a command"),
        (
            "spawn = [\"x\"]\nprovider = \"anthropic\"\n",
            "`spawn` needs provider \"openai\"",
        ),
        (
            "spawn = [\"x\"]\nspawn_timeout = 0\n",
            "`spawn_timeout` must be a number of seconds above 0",
        ),
        (
            "spawn_timeout = 3\n",
            "`spawn_timeout` applies only with `spawn`",
        ),
        (
            "spawn = [\"x\"]\nbase_url = \"http://127.0.0.1:8080/v1\"\n",
            "must hold {port}",
        ),
        ("tool_format = \"xml\"\n", "unknown variant `xml`"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = dir.path().join("host.toml");
        std::fs::write(&host, format!("[models.local]\nmodel = \"m\"\n{extra}")).expect("host");
        let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
            .args(["models", "--host"])
            .arg(&host)
            .output()
            .expect("models");
        assert_eq!(out.status.code(), Some(2), "{extra}");
        assert!(stderr(&out).contains(expected), "{extra}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("[models.local]") || extra.contains("xml"),
            "{}",
            stderr(&out)
        );
    }
    let _ = Path::new(SERVER);
}
