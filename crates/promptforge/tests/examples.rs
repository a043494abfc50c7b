#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every prompt in examples/ runs through the real binary, offline, with the
//! result it is written to give; `check examples` is clean. The research
//! example's web tools reach a local fixture server started here.

use std::path::{Path, PathBuf};
use std::process::Command;

use pf_cases::case::WebFixture;
use pf_cases::WebServer;
use serde_json::Value;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn run(prompt: &str, args: &[&str]) -> Value {
    let dir = examples();
    let mut command = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    command
        .arg("run")
        .arg(dir.join(prompt))
        .args(args)
        .args(["--json", "--seed", "1"])
        .env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_LOG");
    let out = command.output().expect("run");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{prompt}: no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn host(name: &str) -> String {
    examples().join(name).display().to_string()
}

fn completed(report: &Value) -> &str {
    assert_eq!(report["outcome"], "completed", "{report}");
    report["result"].as_str().unwrap_or_default()
}

#[test]
fn check_examples_is_clean() {
    let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("check")
        .arg(examples())
        .output()
        .expect("check");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn hello_and_notes() {
    assert_eq!(completed(&run("hello.md", &["reader"])), "Hello, reader!");
    let store = tempfile::tempdir().expect("tempdir");
    let store_arg = store.path().display().to_string();
    let report = run(
        "notes.md",
        &[
            "The tide rises twice a day.",
            "--host",
            &host("notes.host.toml"),
            "--store",
            &store_arg,
        ],
    );
    assert_eq!(completed(&report), "2 notes saved");
}

#[test]
fn typed_args_greet() {
    let report = run(
        "greet.md",
        &[
            "--arg",
            "name=Ada",
            "--arg",
            "times=2",
            "--arg",
            "shout=true",
        ],
    );
    assert_eq!(completed(&report), "HELLO, ADA! HELLO, ADA!");
    assert_eq!(
        completed(&run("greet.md", &["{\"name\":\"Lin\"}"])),
        "Hello, Lin!"
    );
}

#[test]
fn fanout_digest_writes_its_report() {
    let store = tempfile::tempdir().expect("tempdir");
    let store_arg = store.path().display().to_string();
    let notes =
        "The release moves to Friday.\nTwo hires start Monday.\nThe budget review needs slides.";
    let report = run(
        "digest.md",
        &[
            notes,
            "--host",
            &host("digest.host.toml"),
            "--store",
            &store_arg,
        ],
    );
    assert_eq!(completed(&report), "3 notes summarized into report.md");
    assert_eq!(report["output"]["path"], "report.md");
    let written = std::fs::read_to_string(store.path().join("report.md")).expect("report");
    assert_eq!(
        written,
        "# Digest\n\n- Release moved to Friday.\n- Two new hires start Monday.\n- Budget review needs slides.\n"
    );
}

#[test]
fn the_h1_pass_routes_to_billing() {
    let report = run(
        "router.md",
        &[
            "Where is my refund for invoice A-17?",
            "--host",
            &host("router.host.toml"),
        ],
    );
    assert_eq!(
        completed(&report),
        "billing: Invoice A-17 (42.00 EUR) was paid on 3 January; no refund is due."
    );
}

#[test]
fn the_pipeline_calls_a_critic_and_jumps_back_once() {
    let report = run(
        "pipeline.md",
        &["lighthouses", "--host", &host("pipeline.host.toml")],
    );
    assert_eq!(
        completed(&report),
        "Lighthouses warn ships away from rocks at night. (after 2 rounds)"
    );
}

#[test]
fn the_model_starts_tasks_and_plans_with_their_results() {
    let report = run(
        "planner.md",
        &["four friends", "--host", &host("planner.host.toml")],
    );
    assert_eq!(
        completed(&report),
        "Picnic on Saturday at Riverside park: sunny, 24 C, with shade and tables."
    );
}

#[test]
fn the_research_agent_searches_and_fetches_a_local_page() {
    let dir = examples();
    let raw = std::fs::read_to_string(dir.join("research.web.json")).expect("fixture");
    let fixture: WebFixture = serde_json::from_str(&raw).expect("fixture shape");
    let server = WebServer::start(fixture).expect("fixture server");
    let tmp = tempfile::tempdir().expect("tempdir");
    let replies = std::fs::read_to_string(dir.join("research.replies.json"))
        .expect("replies")
        .replace("{{WEB}}", &server.base());
    std::fs::write(tmp.path().join("replies.json"), replies).expect("write replies");
    let host_file = tmp.path().join("host.toml");
    std::fs::write(
        &host_file,
        format!(
            "[model]\nprovider = \"script\"\nreplies = \"replies.json\"\nrecord = \"requests.jsonl\"\n\n[web]\nsearch = \"gateway\"\nsearch_url = \"{}/search\"\nallow_loopback = true\n",
            server.base()
        ),
    )
    .expect("write host");
    let report = run(
        "research.md",
        &[
            "Why do tides happen?",
            "--host",
            &host_file.display().to_string(),
        ],
    );
    let result = completed(&report).to_string();
    assert!(
        result.starts_with("Tides are caused mainly by the Moon's gravity"),
        "{result}"
    );
    // The model was shown what the tools returned: the search hit and the page text.
    let requests = std::fs::read_to_string(tmp.path().join("requests.jsonl")).expect("requests");
    let last: Value =
        serde_json::from_str(requests.lines().last().expect("a request")).expect("json");
    let shown = last["messages"].to_string();
    // The section's prose is the system message: the instruction reaches the model.
    assert!(
        last["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.starts_with("You are a careful researcher.")),
        "{shown}"
    );
    assert!(shown.contains("Tides explained"), "{shown}");
    assert!(shown.contains("two bulges"), "{shown}");
}

#[test]
fn every_example_has_tests_and_they_pass() {
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .args(["test", "--json"])
        .arg(examples())
        .env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_LOG")
        .env("PROMPTFORGE_HOME", home.path())
        .output()
        .expect("promptforge test");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["failed"], 0, "{report:#}");
    let cases = report["cases"].as_array().expect("cases");
    for prompt in std::fs::read_dir(examples()).expect("examples") {
        let path = prompt.expect("entry").path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let file = format!("{stem}.test.yaml");
        let count = cases
            .iter()
            .filter(|c| c["file"].as_str().is_some_and(|f| f.ends_with(&file)))
            .count();
        assert!(
            count >= 2,
            "{stem}.md has {count} test cases; every example needs its tests"
        );
    }
}

/// The real `@modelcontextprotocol/server-filesystem` (installed by
/// `tests/tools/setup.sh node-mcp DIR`, which test.sh runs), or `None`
/// outside CI when it is absent. Under CI=true its absence fails the test.
fn filesystem_server() -> Option<PathBuf> {
    let from_env = std::env::var_os("PROMPTFORGE_MCP_FILESYSTEM").map(PathBuf::from);
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let installed = target.join("tmp/test-tools/node-mcp/node_modules/.bin/mcp-server-filesystem");
    let found = from_env.or(Some(installed)).filter(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the filesystem MCP server is not installed: run \
             crates/promptforge/tests/tools/setup.sh node-mcp target/tmp/test-tools"
        );
        eprintln!("skipped: the filesystem MCP server is not installed (setup.sh node-mcp)");
    }
    found
}

#[test]
fn the_folder_summary_reads_notes_through_the_real_filesystem_server() {
    let Some(server) = filesystem_server() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let notes = tmp.path().join("notes");
    std::fs::create_dir(&notes).expect("notes");
    std::fs::write(notes.join("release.md"), "The release moves to Friday.\n").expect("write");
    std::fs::write(notes.join("team.md"), "Two hires start Monday.\n").expect("write");
    std::fs::write(notes.join("photo.png"), "not a note").expect("write");
    let host = tmp.path().join("host.toml");
    let requests = tmp.path().join("requests.jsonl");
    std::fs::write(
        &host,
        format!(
            "[model]\nprovider = \"script\"\nreplies = {:?}\nrecord = {:?}\n\n\
             [plugins.\"local/files\"]\ncommand = [{:?}, {:?}]\ntrusted = true\n",
            examples().join("folder-summary.replies.json"),
            requests,
            server,
            notes
        ),
    )
    .expect("host");
    let store = tmp.path().join("store");
    let report = run(
        "folder-summary.md",
        &[
            &notes.display().to_string(),
            "--host",
            &host.display().to_string(),
            "--store",
            &store.display().to_string(),
        ],
    );
    assert!(completed(&report).contains("release.md"), "{report}");
    // The model was shown both notes as the real server read them, wrapped.
    let sent = std::fs::read_to_string(&requests).expect("requests");
    assert!(sent.contains("The release moves to Friday."), "{sent}");
    assert!(sent.contains("Two hires start Monday."), "{sent}");
    assert!(!sent.contains("not a note"), "{sent}");
    assert!(sent.contains("untrusted_input_"), "{sent}");
    let summary = std::fs::read_to_string(store.join("summary.md")).expect("summary.md");
    assert!(summary.contains("Friday"), "{summary}");
}

#[test]
fn the_eval_runs_against_a_catalog_model_repeatedly_with_a_judge() {
    let home = tempfile::tempdir().expect("home");
    let eval = |host: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
            .arg("test")
            .arg(examples().join("explain.eval.yaml"))
            .arg("--host")
            .arg(host)
            .args(["--model", "stand-in", "--repeat", "3", "--json"])
            .env("PROMPTFORGE_HOME", home.path())
            .env_remove("PROMPTFORGE_HOST")
            .output()
            .expect("promptforge test");
        let report: Value = serde_json::from_slice(&out.stdout).expect("json");
        (out.status.code(), report)
    };
    let (code, report) = eval(&examples().join("explain.host.toml"));
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["cases"][0]["runs"], 3, "{report:#}");
    assert_eq!(report["cases"][0]["passes"], 3, "{report:#}");
    // A judge that says FAIL fails the case: the judge is really asked.
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        tmp.path().join("fail.json"),
        r#"["FAIL\nIt never names the Moon."]"#,
    )
    .expect("write");
    let host = tmp.path().join("host.toml");
    std::fs::write(
        &host,
        format!(
            "[models.stand-in]\nprovider = \"script\"\nreplies = {:?}\n\n\
             [models.judge]\nprovider = \"script\"\nreplies = {:?}\n",
            examples().join("explain.replies.json"),
            tmp.path().join("fail.json")
        ),
    )
    .expect("host");
    let (code, report) = eval(&host);
    assert_eq!(code, Some(1), "{report:#}");
    let failures = report["cases"][0]["failures"].to_string();
    assert!(failures.contains("It never names the Moon."), "{failures}");
}

#[test]
fn a_prompt_served_over_mcp_answers_a_client_tool_call() {
    use std::io::{BufRead, BufReader, Write};
    let home = tempfile::tempdir().expect("home");
    let mut child = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("mcp")
        .arg(examples().join("explain.md"))
        .arg("--host")
        .arg(examples().join("explain.host.toml"))
        .env("PROMPTFORGE_HOME", home.path())
        .env_remove("PROMPTFORGE_HOST")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("promptforge mcp");
    let mut stdin = child.stdin.take().expect("stdin");
    for line in [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"cookbook","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"explain","arguments":{"prose":"tide"}}}"#,
    ] {
        writeln!(stdin, "{line}").expect("write");
    }
    let mut answers = std::collections::BTreeMap::new();
    for line in BufReader::new(child.stdout.take().expect("stdout")).lines() {
        let message: Value = serde_json::from_str(&line.expect("line")).expect("json");
        if let Some(id) = message["id"].as_i64() {
            answers.insert(id, message);
            if answers.contains_key(&3) {
                break;
            }
        }
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        answers[&2]["result"]["tools"][0]["name"], "explain",
        "{answers:?}"
    );
    let call = &answers[&3]["result"];
    assert_eq!(call["isError"], false, "{call}");
    assert!(
        call["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("rise and fall of the sea")),
        "{call}"
    );
}
