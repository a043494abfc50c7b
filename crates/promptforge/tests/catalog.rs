//! The model catalog through the real binary: which model is current
//! (`default_model`, `--model`, `PROMPTFORGE_MODEL`), what binds to it (roles,
//! `sys.model`, the requirements notice), `models.get` of a catalog id under
//! `[ui]` (each model's own provider answers), `promptforge models`, and the
//! providers' retry policy and base URL forms against local HTTP servers that
//! count what they are asked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// A folder with scripted replies for `small` and `big`, and `host` as its host file.
    fn new(host: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        for (id, replies) in [
            ("small", json!(["from small", "small again"])),
            ("big", json!(["from big", "big again"])),
        ] {
            std::fs::write(dir.path().join(format!("{id}.json")), replies.to_string())
                .expect("replies");
        }
        std::fs::write(dir.path().join("host.toml"), host).expect("host");
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
            .env_remove("PROMPTFORGE_HOST");
        cmd
    }

    /// Run `prompt` with `extra` flags; the `--json` report and the process output.
    fn run_with(&self, prompt: &str, extra: &[&str], env: &[(&str, &str)]) -> (Value, Output) {
        let file = self.path("p.md");
        std::fs::write(&file, prompt).expect("prompt");
        let mut cmd = self.command(&["run"]);
        cmd.arg(&file)
            .args(["--seed", "1", "--json", "--store"])
            .arg(self.path("store"))
            .args(extra);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run");
        let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (report, out)
    }

    fn run(&self, prompt: &str, extra: &[&str]) -> Value {
        self.run_with(prompt, extra, &[]).0
    }

    fn recorded(&self, id: &str) -> Vec<Value> {
        std::fs::read_to_string(self.path(&format!("{id}.jsonl")))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("record line"))
            .collect()
    }
}

const CATALOG: &str = r#"default_model = "small"

[models.small]
provider = "script"
replies = "small.json"
record = "small.jsonl"
context = 32768
description = "Small and quick"

[models.big]
provider = "script"
model = "big-model-v2"
replies = "big.json"
record = "big.jsonl"
context = 200000
thinking = "Switchable"
"#;

fn prompt(roles: &str, body: &str) -> String {
    format!(
        "---\nname: t\ndescription: t\npromptforge: 0\nmodels:\n{roles}\n---\n\n# T\n\n## S\n\n```lua\n{body}\n```\n"
    )
}

fn writer(body: &str) -> String {
    prompt("  writer: {}", &format!("models.use('writer')\n{body}"))
}

#[test]
fn roles_bind_to_the_default_model_unless_another_is_chosen() {
    let f = Fixture::new(CATALOG);
    let ask = writer("return models.infer('hi') .. '|' .. writer.model_id");
    assert_eq!(f.run(&ask, &[])["result"], "from small|small");
    assert_eq!(f.run(&ask, &["--model", "big"])["result"], "from big|big");
    let (env, _) = f.run_with(&ask, &[], &[("PROMPTFORGE_MODEL", "big")]);
    assert_eq!(env["result"], "from big|big");
    let (flag_wins, _) = f.run_with(&ask, &["--model", "small"], &[("PROMPTFORGE_MODEL", "big")]);
    assert_eq!(flag_wins["result"], "from small|small");
    // The record names the provider's model name, as the wire body would.
    assert_eq!(f.recorded("big")[0]["model"], "big-model-v2");
}

#[test]
fn sys_model_is_the_current_catalog_id() {
    let f = Fixture::new(CATALOG);
    let ask = writer(
        "tools.add_local('stamp', 'Stamp', {}, function() return 'ok' end)\ntools.call('stamp')\nreturn sys.model",
    );
    assert_eq!(f.run(&ask, &[])["result"], "small");
    assert_eq!(f.run(&ask, &["--model", "big"])["result"], "big");
}

#[test]
fn the_requirements_notice_checks_roles_against_the_chosen_model() {
    let f = Fixture::new(CATALOG);
    let deep = prompt(
        "  analyst:\n    keywords: [thinking]\n    min_context: 100000",
        "return 'ran'",
    );
    let refused = f.run(&deep, &[]);
    assert_eq!(refused["error"]["kind"], "RequirementsUnmet", "{refused}");
    assert_eq!(
        refused["error"]["message"],
        "the environment cannot satisfy this prompt:\n\
         - role 'analyst': requires a context of at least 100000 tokens; the current model provides 32768\n\
         - role 'analyst': requires 'thinking'; the current model's thinking capability is Never"
    );
    assert_eq!(f.run(&deep, &["--model", "big"])["result"], "ran");
}

#[test]
fn an_unknown_model_id_is_a_usage_error_listing_the_catalog() {
    let f = Fixture::new(CATALOG);
    let (_, out) = f.run_with(&writer("return 'x'"), &["--model", "huge"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "error: unknown model \"huge\"; the catalog has: big, small"
    );
    let (_, env) = f.run_with(&writer("return 'x'"), &[], &[("PROMPTFORGE_MODEL", "huge")]);
    assert_eq!(env.status.code(), Some(2));
    let models = f
        .command(&["models"])
        .env("PROMPTFORGE_MODEL", "huge")
        .output()
        .expect("models");
    assert_eq!(models.status.code(), Some(2));
}

#[test]
fn with_ui_models_get_reaches_each_catalog_model_through_its_own_provider() {
    let f = Fixture::new(&format!("{CATALOG}\n[ui]\ntheme = \"dark\"\n"));
    let ask = writer(
        "local state = ui()\nlocal h = models.get('big')\nlocal fields = table.concat({ h.name, h.label, h.model_id, h.description, #h.capabilities, h.context, tostring(h.thinking) }, ',')\nreturn table.concat({ state.theme, state.selected_model, table.concat(state.models, '+'), models.infer('to current'), models.infer(h, 'to big'), fields }, '|')",
    );
    let report = f.run(&ask, &[]);
    assert_eq!(
        report["result"], "dark|small|big+small|from small|from big|big,big,big,big,0,8192,nil",
        "{report}"
    );
    let to_small = f.recorded("small");
    let to_big = f.recorded("big");
    assert_eq!((to_small.len(), to_big.len()), (1, 1));
    assert_eq!(to_big[0]["messages"][0]["content"], "to big");
    // Without [ui] there is no snapshot and a catalog id is no role.
    let plain = Fixture::new(CATALOG);
    let no_ui = plain.run(
        &writer(
            "local ok, err = pcall(models.get, 'big')\nreturn type(ui) .. '|' .. tostring(err)",
        ),
        &[],
    );
    assert_eq!(
        no_ui["result"],
        "nil|models.get alias \"big\" is not a bound model role"
    );
}

#[test]
fn the_models_command_lists_the_catalog() {
    let host = format!(
        "{CATALOG}\n[models.remote]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"gpt-x\"\napi_key_env = \"PF_CATALOG_TEST_KEY\"\n\n[models.other]\nprovider = \"anthropic\"\nmodel = \"claude-y\"\napi_key_env = \"PF_CATALOG_TEST_UNSET\"\n"
    );
    let f = Fixture::new(&host);
    let json_out = f
        .command(&["models", "--json"])
        .env("PF_CATALOG_TEST_KEY", "sk-never-shown")
        .env_remove("PF_CATALOG_TEST_UNSET")
        .output()
        .expect("models");
    assert!(json_out.status.success());
    let text = String::from_utf8_lossy(&json_out.stdout);
    assert!(!text.contains("sk-never-shown"), "{text}");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["host_file"], f.path("host.toml").display().to_string());
    assert_eq!(v["current"], "small");
    let ids: Vec<&str> = v["models"]
        .as_array()
        .expect("models")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, vec!["big", "other", "remote", "small"]);
    assert_eq!(
        v["models"][2],
        json!({"id": "remote", "provider": "openai", "model": "gpt-x", "base_url": "http://127.0.0.1:9/v1",
               "context": 128000, "thinking": "Never", "description": "", "key_env": "PF_CATALOG_TEST_KEY",
               "key_set": true, "retries": 0, "tool_format": "native", "current": false})
    );
    assert_eq!(v["models"][1]["key_set"], false);
    assert_eq!(v["models"][3]["key_set"], Value::Null);
    assert_eq!(v["models"][3]["current"], true);

    let text_out = f
        .command(&["models", "--model", "big"])
        .env("PF_CATALOG_TEST_KEY", "sk-never-shown")
        .env_remove("PF_CATALOG_TEST_UNSET")
        .output()
        .expect("models");
    let text = String::from_utf8_lossy(&text_out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!("host file: {}", f.path("host.toml").display())
    );
    assert!(
        lines[1].starts_with("   ID") && lines[1].contains("PROVIDER"),
        "{text}"
    );
    assert!(
        lines[2].starts_with("*  big ") && lines[2].contains("big-model-v2"),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("PF_CATALOG_TEST_KEY (set)")),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("PF_CATALOG_TEST_UNSET (not set)")),
        "{text}"
    );
    assert!(!text.contains("sk-never-shown"));
}

#[test]
fn the_host_file_is_found_under_xdg_config_home_first() {
    let home = tempfile::tempdir().expect("home");
    let xdg = tempfile::tempdir().expect("xdg");
    for (root, id) in [
        (home.path().join(".config"), "from-home"),
        (xdg.path().to_path_buf(), "from-xdg"),
    ] {
        std::fs::create_dir_all(root.join("promptforge")).expect("dir");
        std::fs::write(
            root.join("promptforge/host.toml"),
            format!("[models.{id}]\nprovider = \"script\"\nreplies = \"r.json\"\n"),
        )
        .expect("host");
    }
    let current = |xdg_dir: Option<&Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        cmd.args(["models", "--json"])
            .env("HOME", home.path())
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_MODEL")
            .env_remove("XDG_CONFIG_HOME");
        if let Some(dir) = xdg_dir {
            cmd.env("XDG_CONFIG_HOME", dir);
        }
        let out = cmd.output().expect("models");
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        v["current"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(current(Some(xdg.path())), "from-xdg");
    assert_eq!(current(None), "from-home");
}

// ---------------------------------------------------------------------------
// HTTP providers against local servers
// ---------------------------------------------------------------------------

/// What a counting server saw: each request's path.
type Paths = Arc<Mutex<Vec<String>>>;

/// Serve every POST with `answer(n)` (`n` from 0): a status, extra headers, a JSON body.
fn serve(answer: impl Fn(usize) -> (u16, &'static str, Value) + Send + 'static) -> (String, Paths) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let paths: Paths = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&paths);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let mut length = 0usize;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    if k.trim().eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0u8; length];
            let _ = reader.read_exact(&mut body);
            let n = {
                let mut paths = seen.lock().expect("lock");
                paths.push(first.split_whitespace().nth(1).unwrap_or("").to_string());
                paths.len() - 1
            };
            let (status, headers, reply) = answer(n);
            let reply = reply.to_string();
            let head = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                reply.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    (base, paths)
}

fn openai_text(text: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
           "usage": {"prompt_tokens": 11, "completion_tokens": 4}})
}

fn anthropic_text(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 7, "output_tokens": 3}})
}

fn http_host(provider: &str, base_url: &str, retries: Option<u32>) -> String {
    let retries = retries
        .map(|n| format!("retries = {n}\n"))
        .unwrap_or_default();
    format!(
        "[models.remote]\nprovider = \"{provider}\"\nbase_url = \"{base_url}\"\nmodel = \"m\"\napi_key_env = \"PF_CATALOG_HTTP_KEY\"\nrecord = \"remote.jsonl\"\n{retries}"
    )
}

fn run_http(host: &str) -> (Value, Fixture) {
    let f = Fixture::new(host);
    let (report, _) = f.run_with(
        &writer("return models.infer('one') .. '+' .. models.infer('two')"),
        &[],
        &[("PF_CATALOG_HTTP_KEY", "sk-test")],
    );
    (report, f)
}

#[test]
fn a_failing_server_is_asked_once_by_default_and_n_plus_one_times_with_retries() {
    for (status, headers) in [(429, "Retry-After: 0\r\n"), (500, ""), (503, "")] {
        let (base, paths) = serve(move |_| (status, headers, json!({"error": {"message": "no"}})));
        let (report, _) = run_http(&http_host("openai", &base, None));
        // The status, then the server's own words (a 429's quoted and escaped).
        let message = report["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("non-success backend status {status}: "))
                && message.contains("no"),
            "{report}"
        );
        assert_eq!(
            paths.lock().expect("lock").len(),
            1,
            "status {status}, no retries"
        );

        let (base, paths) = serve(move |_| (status, headers, json!({"error": {"message": "no"}})));
        let (report, f) = run_http(&http_host("openai", &base, Some(2)));
        assert_eq!(report["outcome"], "failed", "{report}");
        assert_eq!(
            paths.lock().expect("lock").len(),
            3,
            "status {status}, retries = 2"
        );
        assert_eq!(f.recorded("remote").len(), 3, "every attempt is recorded");
    }
    // A status below 500 other than 429 is not transient: never retried.
    let (base, paths) = serve(|_| (400, "", json!({"error": {"message": "bad"}})));
    let (_, _) = run_http(&http_host("openai", &base, Some(2)));
    assert_eq!(paths.lock().expect("lock").len(), 1);
}

#[test]
fn a_retried_call_succeeds_and_usage_is_totalled_per_run() {
    let (base, paths) = serve(|n| match n {
        0 => (
            429,
            "Retry-After: 0\r\n",
            json!({"error": {"message": "slow"}}),
        ),
        1 => (200, "", openai_text("a")),
        _ => (200, "", openai_text("b")),
    });
    let (report, _) = run_http(&http_host("openai", &base, Some(1)));
    assert_eq!(report["result"], "a+b", "{report}");
    assert_eq!(paths.lock().expect("lock").len(), 3);
    assert_eq!(
        report["usage"],
        json!({"input_tokens": 22, "output_tokens": 8})
    );
}

#[test]
fn both_providers_reach_their_endpoint_with_either_base_url_form() {
    for (provider, path, reply) in [
        ("openai", "/v1/chat/completions", openai_text("ok")),
        ("anthropic", "/v1/messages", anthropic_text("ok")),
    ] {
        for suffix in ["", "/", "/v1", "/v1/"] {
            let reply = reply.clone();
            let (base, paths) = serve(move |_| (200, "", reply.clone()));
            let (report, _) = run_http(&http_host(provider, &format!("{base}{suffix}"), None));
            assert_eq!(report["result"], "ok+ok", "{provider} {suffix}: {report}");
            assert_eq!(
                *paths.lock().expect("lock"),
                vec![path.to_string(), path.to_string()],
                "{provider} with base_url suffix {suffix:?}"
            );
        }
    }
}

/// Every attempt at a round is its own exchange in the run log, with its
/// status: a 503 and then a success are attempts 1 (503, the server's words
/// in its error) and 2 (200, the reply), and the `record` file has both
/// requests under the model name the body sent (`m`), not the catalog id.
#[test]
fn each_attempt_is_logged_with_its_status() {
    let (base, paths) = serve(|n| match n {
        0 => (
            503,
            "",
            json!({"error": {"message": "the backend is warming up"}}),
        ),
        _ => (200, "", openai_text("done")),
    });
    let f = Fixture::new(&http_host("openai", &base, Some(1)));
    let home = f.path("home");
    let home_text = home.display().to_string();
    let (report, out) = f.run_with(
        &writer("return models.infer('one')"),
        &[],
        &[
            ("PF_CATALOG_HTTP_KEY", "sk-test"),
            ("PROMPTFORGE_HOME", home_text.as_str()),
        ],
    );
    assert_eq!(report["result"], "done", "{report} {out:?}");
    assert_eq!(paths.lock().expect("lock").len(), 2);
    let execution = report["execution"].as_str().expect("execution");
    let shown = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .args(["show", execution, "--json"])
        .env("PROMPTFORGE_HOME", &home)
        .output()
        .expect("show");
    let run: Value = serde_json::from_slice(&shown.stdout).expect("show --json");
    let exchanges = run["exchanges"].as_array().expect("exchanges");
    let summary: Vec<(Value, Value, bool)> = exchanges
        .iter()
        .map(|x| {
            (
                x["attempt"].clone(),
                x["status"].clone(),
                x["response"].is_null(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![(json!(1), json!(503), true), (json!(2), json!(200), false)],
        "{run}"
    );
    let first_error = exchanges[0]["error"].as_str().unwrap_or_default();
    assert!(
        first_error.contains("503") && first_error.contains("the backend is warming up"),
        "{first_error}"
    );
    assert_eq!(exchanges[0]["seq"], exchanges[1]["seq"], "one round");
    assert_eq!(exchanges[1]["response"]["content"], "done");
    let recorded = f.recorded("remote");
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    for line in &recorded {
        assert_eq!(line["model"], "m", "the wire model name: {line}");
    }
}
