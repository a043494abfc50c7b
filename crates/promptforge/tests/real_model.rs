//! The real-model tier: SmolLM2-135M-Instruct served by llama.cpp's own
//! server (the `xllamacpp` wheel) through a catalog model's `spawn`, driven
//! through the CLI: a model round with real text, token usage and llama.cpp
//! timings in `show --json`; live streaming on a terminal; `replay` of that
//! run with no server; `run --resume` after the server was killed mid-run;
//! `test --model` against it. With `PROMPTFORGE_REAL_TOOLS=1`, Qwen2.5-Coder
//! 0.5B drives a `models.loop` with a local tool through `tool_format = "json"`.
//!
//! The venv and the models come from `tests/tools/setup.sh llama` and
//! `setup.sh qwen` (test.sh runs them; these tests run them too when missing,
//! and fail loudly when they cannot install). Small models say little of
//! use: the tests check shapes (text, counts, timings), not wisdom.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

fn tools_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-tools")
}

fn here(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/real_models")
        .join(name)
}

fn setup(tool: &str) {
    static ONCE: Mutex<()> = Mutex::new(());
    let _guard = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/setup.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg(tool)
        .arg(tools_dir())
        .status()
        .expect("run tests/tools/setup.sh");
    assert!(
        status.success(),
        "tests/tools/setup.sh {tool} failed: the real-model tests need it (see test.sh)"
    );
}

/// A folder with a host file whose model `local` is `gguf` served through
/// `spawn`; the server writes its pid to `server.pid`.
struct Local {
    dir: tempfile::TempDir,
}

impl Local {
    fn new(gguf: &Path, extra: &str) -> Local {
        let venv = tools_dir().join("llama");
        let dir = tempfile::tempdir().expect("tempdir");
        let host = format!(
            "[models.local]\nmodel = \"local\"\ncontext = 4096\nspawn_timeout = 300\nspawn = [{:?}, {:?}, \"--model\", {:?}, \"--port\", \"{{port}}\", \"--ctx\", \"4096\", \"--pid-file\", {:?}]\n{extra}",
            venv.join("bin/python").display().to_string(),
            here("llama_server.py").display().to_string(),
            gguf.display().to_string(),
            dir.path().join("server.pid").display().to_string(),
        );
        std::fs::write(dir.path().join("host.toml"), host).expect("host");
        Local { dir }
    }

    fn smollm2() -> Local {
        setup("llama");
        Local::new(&tools_dir().join("llama/smollm2.gguf"), "")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn pf(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        cmd.env("PROMPTFORGE_HOME", self.path("home"))
            .env_remove("PROMPTFORGE_MODEL")
            .env_remove("PROMPTFORGE_HOST")
            .current_dir(self.dir.path());
        cmd
    }

    fn run(&self, prompt: &str, extra: &[&str]) -> (Value, Output) {
        let out = self
            .pf()
            .arg("run")
            .arg(here(prompt))
            .args(["--json", "--seed", "5", "--host"])
            .arg(self.path("host.toml"))
            .args(extra)
            .output()
            .expect("run");
        (
            serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
            out,
        )
    }

    fn show(&self, run: &str) -> Value {
        let out = self
            .pf()
            .args(["show", run, "--json"])
            .output()
            .expect("show");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!("show: {}", String::from_utf8_lossy(&out.stderr));
        })
    }

    fn server_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.path("server.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

fn assert_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "the model server {pid} outlived promptforge");
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `assistant_reply` events of a shown run.
fn replies(shown: &Value) -> Vec<Value> {
    shown["events"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|e| e["kind"] == "assistant_reply")
        .cloned()
        .collect()
}

#[test]
fn a_real_round_has_text_usage_and_timings_and_replays_without_the_server() {
    let local = Local::smollm2();
    let started = Instant::now();
    let (report, out) = local.run("sea.md", &[]);
    eprintln!(
        "one SmolLM2 run, server start included: {:?}",
        started.elapsed()
    );
    assert_eq!(report["outcome"], "completed", "{report}\n{}", stderr(&out));
    let text = report["result"].as_str().unwrap_or_default();
    assert!(!text.trim().is_empty(), "{report}");
    assert!(
        report["usage"]["input_tokens"].as_u64().unwrap_or(0) > 5,
        "{report}"
    );
    assert!(
        report["usage"]["output_tokens"].as_u64().unwrap_or(0) > 0,
        "{report}"
    );
    assert_gone(local.server_pid().expect("the server wrote its pid"));

    let shown = local.show("last");
    let replies = replies(&shown);
    assert_eq!(replies.len(), 1, "{shown}");
    let metrics = &replies[0]["metrics"];
    assert!(
        metrics["usage"]["prompt_tokens"].as_u64().unwrap() > 5,
        "{metrics}"
    );
    let llama = &metrics["llama"];
    assert!(llama["prompt_n"].as_u64().unwrap() > 0, "{metrics}");
    assert!(llama["predicted_n"].as_u64().unwrap() > 0, "{metrics}");
    assert!(
        llama["predicted_per_second"].as_f64().unwrap() > 0.0,
        "{metrics}"
    );
    assert_eq!(
        llama["predicted_n"], metrics["usage"]["completion_tokens"],
        "llama.cpp counts what it reports as usage"
    );
    eprintln!(
        "SmolLM2: {} prompt tokens at {:.1}/s, {} predicted at {:.1}/s",
        llama["prompt_n"],
        llama["prompt_per_second"].as_f64().unwrap(),
        llama["predicted_n"],
        llama["predicted_per_second"].as_f64().unwrap()
    );

    // Replay answers from the log: no server starts, the result is the same.
    std::fs::remove_file(local.path("server.pid")).expect("pid file");
    let out = local
        .pf()
        .args(["replay", "last", "--json", "--host"])
        .arg(local.path("host.toml"))
        .output()
        .expect("replay");
    let replayed: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(replayed["result"], report["result"], "{}", stderr(&out));
    assert!(local.server_pid().is_none(), "replay started the server");
}

#[test]
fn a_terminal_sees_the_real_reply_stream() {
    let local = Local::smollm2();
    let result = local.path("result.txt");
    let command = format!(
        "{} run {} --host {} > {}",
        env!("CARGO_BIN_EXE_promptforge"),
        here("sea.md").display(),
        local.path("host.toml").display(),
        result.display()
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("PROMPTFORGE_HOME", local.path("home"))
        .env_remove("PROMPTFORGE_LOG")
        .output()
        .expect("`script` (util-linux) runs the command on a pseudo-terminal");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let screen = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let answer = std::fs::read_to_string(&result).expect("result");
    assert!(!answer.trim().is_empty());
    assert!(screen.contains("[Ask, round 1]"), "{screen:?}");
    // The streamed text is the result, shown as it came.
    let first_words: String = answer.trim().chars().take(12).collect();
    assert!(screen.contains(&first_words), "{screen:?} vs {answer:?}");
    // A streamed round: llama.cpp's timings from the stream's last chunk, and
    // the client's own clock of the fragments.
    let shown = local.show("last");
    let metrics = &replies(&shown)[0]["metrics"];
    assert!(
        metrics["llama"]["predicted_n"].as_u64().unwrap_or(0) > 0,
        "{metrics}"
    );
    assert!(
        metrics["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{metrics}"
    );
    assert!(
        metrics["client"]["ttft_ms"].as_f64().unwrap_or(0.0) > 0.0,
        "{metrics}"
    );
    assert!(
        metrics["client"]["mean_itl_ms"].as_f64().unwrap_or(0.0) > 0.0,
        "{metrics}"
    );
}

#[test]
fn a_run_whose_server_was_killed_resumes_with_a_new_one() {
    let local = Local::smollm2();
    let mut child = local
        .pf()
        .arg("run")
        .arg(here("two_rounds.md"))
        .args(["--json", "--seed", "5", "--host"])
        .arg(local.path("host.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    // Kill the server (its whole group) once the first round is logged.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        assert!(Instant::now() < deadline, "the first round never completed");
        let out = local
            .pf()
            .args(["show", "last", "--json"])
            .output()
            .expect("show");
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if shown.is_object() && !replies(&shown).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = local.server_pid().expect("pid");
    let killed = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = child.wait().expect("wait");
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let failed: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    assert_eq!(status.code(), Some(1), "{failed}");
    assert_eq!(failed["outcome"], "failed", "{failed}");
    let first_run = local.show("last");

    let (resumed, out) = local.run("two_rounds.md", &["--resume", "last"]);
    assert_eq!(
        resumed["outcome"],
        "completed",
        "{resumed}\n{}",
        stderr(&out)
    );
    // The first round is answered from the log, the second by the new server.
    let first = replies(&first_run)[0]["text"].as_str().unwrap().to_string();
    let result = resumed["result"].as_str().unwrap();
    assert!(
        result.starts_with(&format!("{first} / ")),
        "{result:?} after {first:?}"
    );
    assert!(result.len() > first.len() + 3, "{result:?}");
    let shown = local.show("last");
    assert!(
        shown["resumed_from"].is_string() || shown["resumed_from"].is_number(),
        "{shown}"
    );
    assert_gone(local.server_pid().expect("pid"));
}

#[test]
fn test_model_runs_a_case_against_the_real_model() {
    let local = Local::smollm2();
    std::fs::write(
        local.path("sea.test.yaml"),
        format!(
            "prompt: {:?}\ncases:\n  - name: answers with text\n    expect:\n      events:\n        assistant_reply: 1\n",
            here("sea.md").display().to_string()
        ),
    )
    .expect("test file");
    let out = local
        .pf()
        .arg("test")
        .arg(local.path("sea.test.yaml"))
        .args(["--model", "local", "--host"])
        .arg(local.path("host.toml"))
        .output()
        .expect("test");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed, 0 failed"));
}

/// Qwen2.5-Coder-0.5B writes its calls as JSON text: `tool_format = "json"`
/// turns them into a `models.loop`'s tool calls. Slow (6-8 tokens/s), so
/// only with PROMPTFORGE_REAL_TOOLS=1.
#[test]
fn qwen_calls_a_local_tool_through_the_json_dialect() {
    if std::env::var("PROMPTFORGE_REAL_TOOLS").as_deref() != Ok("1") {
        eprintln!("skipped: set PROMPTFORGE_REAL_TOOLS=1 to run the Qwen tool-call tier");
        return;
    }
    setup("qwen");
    let local = Local::new(
        &tools_dir().join("qwen/qwen2.5-coder-0.5b-instruct.gguf"),
        "tool_format = \"json\"\n",
    );
    let started = Instant::now();
    let (report, out) = local.run("tools.md", &[]);
    let took = started.elapsed();
    assert_eq!(report["outcome"], "completed", "{report}\n{}", stderr(&out));
    let result = report["result"].as_str().unwrap();
    let shown = local.show("last");
    let count = |kind: &str| {
        shown["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == kind)
            .count()
    };
    let rounds = count("model_turn_completed");
    let calls = count("assistant_tool_calls");
    let results = count("tool_result");
    // llama.cpp's timings of every round, from the logged exchanges.
    let (mut predicted, mut predicted_ms, mut prompt, mut prompt_ms) = (0u64, 0f64, 0u64, 0f64);
    for exchange in shown["exchanges"].as_array().unwrap() {
        let llama = &exchange["response"]["llama"];
        predicted += llama["predicted_n"].as_u64().unwrap_or(0);
        predicted_ms += llama["predicted_ms"].as_f64().unwrap_or(0.0);
        prompt += llama["prompt_n"].as_u64().unwrap_or(0);
        prompt_ms += llama["prompt_ms"].as_f64().unwrap_or(0.0);
    }
    eprintln!(
        "Qwen tier: {rounds} rounds, {calls} with tool calls, {results} tool results; {predicted} tokens predicted at {:.1} tokens/s, {prompt} prompt tokens at {:.1} tokens/s; {:.1} s in all (server start included); result {result:?}",
        predicted as f64 / (predicted_ms / 1000.0),
        prompt as f64 / (prompt_ms / 1000.0),
        took.as_secs_f64()
    );
    // The tool ran with well-formed arguments and its result went back.
    assert!(result.starts_with("called with city=Paris"), "{result}");
    assert!(calls >= 1 && results >= 1 && rounds >= 2, "{shown}");
}
