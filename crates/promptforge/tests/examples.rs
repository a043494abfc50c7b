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
