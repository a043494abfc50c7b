#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `promptforge test` as a comparison matrix (issue 47), through the real
//! binary: two catalog models (two local OpenAI-compatible servers that
//! answer differently and count what they are sent) × two versions of a
//! prompt × three cases (one judged). The grid comes out right in text,
//! JSON, JUnit (read back by Python's XML parser) and HTML (loaded in a real
//! headless Chromium: grid, totals, sorting, trace-page links); `--cache`
//! on a second run sends no request and gives the same grid, its tokens and
//! cost reported as saved; `--repeat 5` reports rates and Wilson intervals;
//! a model's `concurrency` holds for test cells.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

/// Which way a server answers.
#[derive(Clone, Copy)]
enum Voice {
    /// "Hello, X!" / "Goodbye, X."; judges: PASS when the output greets.
    Polite,
    /// "hi X" / "bye X".
    Terse,
}

/// What a server counted.
#[derive(Default)]
struct Counts {
    requests: AtomicUsize,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

/// A local OpenAI-compatible server answering in `voice`, holding each
/// reply `hold` so concurrent requests overlap.
fn serve(voice: Voice, hold: Duration) -> (String, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let counts = Arc::new(Counts::default());
    let c = Arc::clone(&counts);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let c = Arc::clone(&c);
            std::thread::spawn(move || answer(stream, voice, hold, &c));
        }
    });
    (base, counts)
}

fn answer(mut stream: TcpStream, voice: Voice, hold: Duration, counts: &Counts) {
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
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    counts.requests.fetch_add(1, Ordering::SeqCst);
    let now = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    counts.peak.fetch_max(now, Ordering::SeqCst);
    std::thread::sleep(hold);
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let system = messages
        .first()
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let last = messages
        .last()
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string();
    let text = if system.starts_with("You grade the output") {
        let output = last
            .split("<output>")
            .nth(1)
            .and_then(|rest| rest.split("</output>").next())
            .unwrap_or("");
        if output.contains("Hello") || output.contains("hi ") {
            "PASS\nIt greets.".to_string()
        } else {
            "FAIL\nNo greeting.".to_string()
        }
    } else {
        let name = last.rsplit(' ').next().unwrap_or("").to_string();
        let hello = last.contains("hello");
        match (voice, hello) {
            (Voice::Polite, true) => format!("Hello, {name}!"),
            (Voice::Polite, false) => format!("Goodbye, {name}."),
            (Voice::Terse, true) => format!("hi {name}"),
            (Voice::Terse, false) => format!("bye {name}"),
        }
    };
    let (prompt_tokens, completion_tokens) = match voice {
        Voice::Polite => (10, 5),
        Voice::Terse => (20, 2),
    };
    let reply = json!({"id": "c", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens}})
    .to_string();
    counts.in_flight.fetch_sub(1, Ordering::SeqCst);
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(reply.as_bytes());
}

const HELLO: &str = "---\nname: greet\ndescription: greets by name\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Greet\n\n## Only\n\n```lua\nmodels.use('w')\nreturn models.infer('Say hello to ' .. args)\n```\n";
const GOODBYE: &str = "---\nname: greet\ndescription: greets by name\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Greet\n\n## Only\n\n```lua\nmodels.use('w')\nreturn models.infer('Say goodbye to ' .. args)\n```\n";

const CASES: &str = "cases:
  - name: names the person
    args: Ada
    replies: [scripted]
    expect: {result: {contains: Ada}}
  - name: says Hello
    args: Cy
    expect: {result: {contains: Hello}}
  - name: judged greeting
    args: Bob
    expect:
      judge: {model: a, rubric: The output greets the person.}
";

/// The expected grid: case × (v1@a, v1@b, v2@a, v2@b), pass or not.
const GRID: [[bool; 4]; 3] = [
    [true, true, true, true],
    [true, false, false, false],
    [true, true, false, false],
];

struct World {
    dir: tempfile::TempDir,
    a: Arc<Counts>,
    b: Arc<Counts>,
}

impl World {
    fn new(hold: Duration) -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a_url, a) = serve(Voice::Polite, hold);
        let (b_url, b) = serve(Voice::Terse, hold);
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        // Both servers serve a model of one name: the catalog ids tell them
        // apart, for the per-model limits and for the cache.
        write("greet.md", HELLO);
        write("greet-v2.md", GOODBYE);
        write("greet.test.yaml", CASES);
        write(
            "host.toml",
            &format!(
                "[models.a]\nprovider = \"openai\"\nbase_url = \"{a_url}\"\nmodel = \"shared-1\"\n\
                 input_price = 1.0\noutput_price = 2.0\nconcurrency = 3\n\n\
                 [models.b]\nprovider = \"openai\"\nbase_url = \"{b_url}\"\nmodel = \"shared-1\"\n\
                 input_price = 0.5\noutput_price = 4\nconcurrency = 2\n"
            ),
        );
        World { dir, a, b }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `promptforge test ARGS` in the world: exit code, stdout, stderr.
    fn test(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
            .arg("test")
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("PROMPTFORGE_LOG")
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_MODEL")
            .env("PROMPTFORGE_HOME", self.path("home"))
            .output()
            .expect("run promptforge test");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn requests(&self) -> (usize, usize) {
        (
            self.a.requests.load(Ordering::SeqCst),
            self.b.requests.load(Ordering::SeqCst),
        )
    }
}

const MATRIX: &[&str] = &[
    "greet.test.yaml",
    "--host",
    "host.toml",
    "--model",
    "a",
    "--model",
    "b",
    "--prompt",
    "greet.md",
    "--prompt",
    "greet-v2.md",
    "-j",
    "8",
];

const COLUMNS: [&str; 4] = [
    "greet.md @ a",
    "greet.md @ b",
    "greet-v2.md @ a",
    "greet-v2.md @ b",
];

fn with(extra: &[&str]) -> Vec<String> {
    MATRIX
        .iter()
        .chain(extra)
        .map(|s| (*s).to_string())
        .collect()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The grid as JSON reports it: (case, column) → passed.
fn json_grid(report: &Value) -> Vec<Vec<bool>> {
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 12, "{report}");
    cases
        .chunks(4)
        .map(|row| {
            row.iter()
                .enumerate()
                .map(|(c, cell)| {
                    assert_eq!(cell["column"], COLUMNS[c], "{cell}");
                    cell["passed"].as_bool().expect("passed")
                })
                .collect()
        })
        .collect()
}

fn expected_grid() -> Vec<Vec<bool>> {
    GRID.iter().map(|r| r.to_vec()).collect()
}

#[test]
fn a_matrix_of_models_and_prompt_versions_in_every_format_then_from_the_cache() {
    let world = World::new(Duration::from_millis(150));
    // First run: JSON, JUnit and the HTML page, all from live servers.
    let (code, out, err) = world.test(&args(&with(&[
        "--json",
        "--junit",
        "junit.xml",
        "--html",
        "grid.html",
    ])));
    assert_eq!(code, 1, "failing cells fail the command: {out}{err}");
    let report: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(json_grid(&report), expected_grid());
    assert_eq!(
        (report["passed"].as_u64(), report["failed"].as_u64()),
        (Some(7), Some(5))
    );
    // 3 cases × 2 prompts each way; model a also judged 4 runs.
    assert_eq!(world.requests(), (6 + 4, 6));
    // Each model's `concurrency` holds for test cells, and cells do overlap.
    let peaks = (
        world.a.peak.load(Ordering::SeqCst),
        world.b.peak.load(Ordering::SeqCst),
    );
    assert!(
        peaks.0 <= 3 && peaks.1 <= 2,
        "peak requests in flight {peaks:?}"
    );
    assert!(
        world.a.peak.load(Ordering::SeqCst) >= 2,
        "cells run concurrently"
    );
    let cells = report["cases"].as_array().unwrap();
    // Per cell: execution id, its logged run, tokens, cost, latency, result.
    let first = &cells[0];
    assert!(
        first["executions"][0].as_str().unwrap().starts_with("run-"),
        "{first}"
    );
    assert!(
        first["logged"][0].as_str().unwrap().starts_with('#'),
        "{first}"
    );
    assert_eq!(
        (
            first["input_tokens"].as_u64(),
            first["output_tokens"].as_u64()
        ),
        (Some(10), Some(5))
    );
    assert!(
        (first["cost"].as_f64().unwrap() - 2e-5).abs() < 1e-12,
        "{first}"
    );
    assert_eq!(first["result"], "Hello, Ada!");
    assert_eq!(first["cached"], false);
    assert!(first["latency_ms"].as_u64().unwrap() >= 150);
    // A judged cell counts its judge call too: a's round and a's judge.
    let judged_v1_a = &cells[8];
    assert_eq!(judged_v1_a["input_tokens"], 20, "{judged_v1_a}");
    let terse = &cells[1];
    assert!(
        (terse["cost"].as_f64().unwrap() - 1.8e-5).abs() < 1e-12,
        "{terse}"
    );
    // A failing cell names the failed expectation.
    let failed = &cells[5];
    assert_eq!(failed["passed"], false);
    assert_eq!(failed["failures"][0]["assertion"], "result", "{failed}");
    assert_eq!(failed["result"], "hi Cy");
    let judged_wrong = &cells[10];
    assert!(
        judged_wrong["failures"][0]["message"]
            .as_str()
            .unwrap()
            .contains("the judge said FAIL: No greeting."),
        "{judged_wrong}"
    );
    // Column totals.
    let totals = report["matrix"]["totals"].as_array().expect("totals");
    assert_eq!(report["matrix"]["columns"], json!(COLUMNS));
    assert_eq!(totals.len(), 4);
    assert_eq!(totals[0]["passed"], 3);
    assert_eq!(totals[3]["passed"], 1);
    assert_eq!(totals[0]["input_tokens"], 10 * 3 + 10);
    let batch = report["matrix"]["batch"]
        .as_str()
        .expect("batch id")
        .to_string();
    assert!(batch.starts_with("test-"));
    // The runs are in the log under the batch id.
    let runs = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .args(["runs", "--batch", &batch, "--json"])
        .env("PROMPTFORGE_HOME", world.path("home"))
        .output()
        .expect("runs");
    let listed = String::from_utf8_lossy(&runs.stdout);
    assert_eq!(listed.matches("\"execution\"").count(), 12, "{listed}");

    // JUnit: a testcase per cell, named with its column, read back by Python.
    let junit = std::fs::read_to_string(world.path("junit.xml")).expect("junit written");
    let parsed = Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, xml.etree.ElementTree as ET\n\
             root = ET.parse(sys.argv[1]).getroot()\n\
             for c in root.iter('testcase'):\n\
             \x20   print(c.get('name'), 'FAIL' if c.find('failure') is not None else 'ok')\n",
        )
        .arg(world.path("junit.xml"))
        .output()
        .expect("python3");
    assert!(parsed.status.success(), "{junit}");
    let lines = String::from_utf8_lossy(&parsed.stdout).into_owned();
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 12, "{junit}");
    assert_eq!(lines[0], "names the person [greet.md @ a] ok");
    assert_eq!(lines[5], "says Hello [greet.md @ b] FAIL");

    // HTML: checked in Chromium below; the trace pages sit beside it.
    let html = std::fs::read_to_string(world.path("grid.html")).expect("page written");
    check_page(&world, &html);

    // Second run with --cache: no request reaches either server, same grid.
    let before = world.requests();
    let (code, text, err) = world.test(&args(&with(&["--cache"])));
    assert_eq!(code, 1, "{text}{err}");
    assert_eq!(world.requests(), before, "--cache sent a request: {text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ok ") || l.starts_with("FAILED"))
        .collect();
    assert_eq!(rows.len(), 12, "{text}");
    for (at, row) in rows.iter().enumerate() {
        let (case, column) = (at / 4, at % 4);
        let status = if GRID[case][column] {
            "ok    "
        } else {
            "FAILED"
        };
        assert!(row.starts_with(status), "{row}");
        assert!(row.contains(&format!("[{}]", COLUMNS[column])), "{row}");
        assert!(row.ends_with("[cached]"), "{row}");
    }
    // The summary table: a row per case, the totals, what the cache saved.
    assert!(text.contains("case  "), "{text}");
    let table_row = text
        .lines()
        .find(|l| l.starts_with("greet.test.yaml: says Hello"))
        .expect("a table row per case");
    let cells_in_row: Vec<&str> = table_row
        .split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(
        cells_in_row[1..],
        ["pass *", "FAIL *", "FAIL *", "FAIL *"],
        "{table_row}"
    );
    assert!(text.contains("pass rate"), "{text}");
    assert!(text.contains("median latency"), "{text}");
    assert!(text.contains("saved (cache)"), "{text}");
    assert!(
        text.contains("cache: 16 model rounds answered from the run log, saved"),
        "{text}"
    );
    assert!(text.ends_with("7 passed, 5 failed\n"), "{text}");

    // And as JSON: the same grid, nothing paid, everything saved.
    let (_, out, _) = world.test(&args(&with(&["--cache", "--json"])));
    assert_eq!(world.requests(), before);
    let cached: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json_grid(&cached), expected_grid());
    let first = &cached["cases"][0];
    assert_eq!(first["cached"], true);
    assert_eq!(first["cost"].as_f64(), Some(0.0), "{first}");
    assert!(
        (first["saved_cost"].as_f64().unwrap() - 2e-5).abs() < 1e-12,
        "{first}"
    );
    assert_eq!(first["saved_tokens"], 15);
    assert_eq!(first["result"], "Hello, Ada!");

    // A prompt edit that changes the request is never answered from the cache.
    std::fs::write(
        world.path("greet-v2.md"),
        GOODBYE.replace("Say goodbye to", "Say farewell to"),
    )
    .unwrap();
    let (_, out, _) = world.test(&args(&with(&["--cache", "--json"])));
    let edited: Value = serde_json::from_str(&out).expect("JSON");
    // Only v2's rounds go out; its judged output reads as before, so the
    // judge's question is the logged one and stays cached.
    assert_eq!(world.requests(), (before.0 + 3, before.1 + 3));
    assert_eq!(edited["cases"][0]["cached"], true);
    assert_eq!(edited["cases"][2]["cached"], false);
}

fn check_page(world: &World, html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>"));
    for external in ["<link", "src=\"http", "src=\"//", "@import", "url(http"] {
        assert!(!html.contains(external), "external resource: {external}");
    }
    assert_eq!(
        html.matches("<script").count(),
        1,
        "only the page's own script"
    );
    let page = world.path("grid.html");
    let browsed = browse(&page, "");
    assert!(
        browsed.dom.contains("data-ready=\"1\""),
        "the page's script did not run"
    );
    for bad in ["Uncaught", "Refused to", "SyntaxError", "ReferenceError"] {
        assert!(
            !browsed.log.contains(bad),
            "console trouble ({bad}):\n{}",
            browsed.log
        );
    }
    // The grid: three case rows, four columns, coloured by result.
    let body = between(&browsed.dom, "<tbody>", "</tbody>");
    assert_eq!(body.matches("<tr").count(), 3, "{body}");
    assert_eq!(body.matches("<td class=\"pass").count(), 7);
    assert_eq!(body.matches("<td class=\"fail").count(), 5);
    for column in COLUMNS {
        assert!(
            browsed
                .dom
                .contains(&format!("<th scope=\"col\">{column}</th>")),
            "{column}"
        );
    }
    // Totals per column.
    let foot = between(&browsed.dom, "<tfoot>", "</tfoot>");
    assert!(foot.contains("<td>100% (3/3 cells)</td>"), "{foot}");
    assert!(foot.contains("<td>33% (1/3 cells)</td>"), "{foot}");
    assert!(foot.contains("median latency"), "{foot}");
    assert!(foot.contains("<td>60 (40 in, 20 out)</td>"), "{foot}");
    // Links to each run's trace page, written beside the page.
    let links: Vec<&str> = browsed
        .dom
        .match_indices("class=\"trace\" href=\"")
        .map(|(at, m)| {
            let rest = &browsed.dom[at + m.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect();
    assert_eq!(links.len(), 12);
    for link in &links {
        assert!(link.starts_with("grid.traces/"), "{link}");
        let trace = world.dir.path().join(link);
        let text = std::fs::read_to_string(&trace).expect("trace page written");
        assert!(text.starts_with("<!DOCTYPE html>"), "{link}");
    }
    let trace = browse(&world.dir.path().join(links[0]), "");
    assert!(
        trace.dom.contains("data-ready=\"1\""),
        "the trace page loads"
    );
    assert!(trace.dom.contains("Hello, Ada!"), "the run's own reply");
    // Sorting: by the v1@b column, descending, passing rows come first.
    let sorted = browse(&page, "#sort=-2");
    assert!(sorted.dom.contains("data-sorted=\"-2\""), "sorted on load");
    let body = between(&sorted.dom, "<tbody>", "</tbody>");
    let order: Vec<usize> = body
        .match_indices("<tr data-index=\"")
        .map(|(at, m)| {
            body[at + m.len()..]
                .chars()
                .next()
                .unwrap()
                .to_digit(10)
                .unwrap() as usize
        })
        .collect();
    assert_eq!(order, vec![0, 2, 1], "{body}");
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> &'a str {
    let start = text.find(open).unwrap_or_else(|| panic!("no {open}")) + open.len();
    let end = start
        + text[start..]
            .find(close)
            .unwrap_or_else(|| panic!("no {close}"));
    &text[start..end]
}

#[test]
fn repeat_reports_pass_rates_with_wilson_intervals() {
    let world = World::new(Duration::from_millis(0));
    let (code, out, err) = world.test(&[
        "greet.test.yaml",
        "--host",
        "host.toml",
        "--model",
        "a",
        "--model",
        "b",
        "--filter",
        "Hello",
        "--repeat",
        "5",
        "--json",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON");
    let cells = report["cases"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    assert_eq!(
        (cells[0]["passes"].as_u64(), cells[0]["runs"].as_u64()),
        (Some(5), Some(5))
    );
    assert_eq!(cells[0]["pass_rate"], 1.0);
    let interval = cells[0]["interval"].as_array().expect("an interval");
    assert!(
        (interval[0].as_f64().unwrap() - 0.5655).abs() < 1e-3,
        "{interval:?}"
    );
    assert!((interval[1].as_f64().unwrap() - 1.0).abs() < 1e-9);
    assert_eq!(cells[1]["passes"], 0);
    let interval = cells[1]["interval"].as_array().expect("an interval");
    assert_eq!(interval[0].as_f64(), Some(0.0));
    assert!(
        (interval[1].as_f64().unwrap() - 0.4345).abs() < 1e-3,
        "{interval:?}"
    );
    assert_eq!(cells[0]["executions"].as_array().unwrap().len(), 5);
    assert_eq!(world.requests(), (5, 5));
    // In text: the rate and interval in the table.
    let (_, text, _) = world.test(&[
        "greet.test.yaml",
        "--host",
        "host.toml",
        "--model",
        "a",
        "--model",
        "b",
        "--filter",
        "Hello",
        "--repeat",
        "5",
    ]);
    assert!(text.contains("ok 5/5 100% [57-100%]"), "{text}");
    assert!(text.contains("FAIL 0/5 0% [0-43%]"), "{text}");
}

#[test]
fn bad_matrix_flags_are_usage_errors() {
    let world = World::new(Duration::from_millis(0));
    let (code, _, err) = world.test(&[
        "greet.test.yaml",
        "--host",
        "host.toml",
        "--model",
        "a",
        "--model",
        "a",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--model a is given twice"), "{err}");
    let (code, _, err) = world.test(&["greet.test.yaml", "--prompt", "missing.md"]);
    assert_eq!(code, 2);
    assert!(err.contains("--prompt missing.md: no such file"), "{err}");
    let (code, _, err) = world.test(&["greet.test.yaml", "--host", "host.toml", "--model", "zz"]);
    assert_eq!(code, 2);
    assert!(err.contains("has no model \"zz\""), "{err}");
    std::fs::write(
        world.path("host-bad.toml"),
        "[models.a]\nprovider = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"x\"\ninput_price = -1\n",
    )
    .unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .args(["check", "--host", "host-bad.toml", "greet.md"])
        .current_dir(world.dir.path())
        .output()
        .expect("check");
    let err = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(2), "{err}");
    assert!(err.contains("input_price"), "{err}");
    assert!(err.contains("a number from 0 up"), "{err}");
}

#[test]
fn text_from_a_run_is_only_text_on_the_page() {
    // A hostile name in the case, echoed back by the model, and a hostile
    // case name: both must show as text, and nothing of theirs may run.
    let world = World::new(Duration::from_millis(0));
    let hostile = "<img/src=x/onerror=document.body.setAttribute('data-pwned','1')>";
    std::fs::write(
        world.path("hostile.test.yaml"),
        format!(
            "cases:\n  - name: \"<script>document.body.setAttribute('data-pwned','1')</script>\"\n    args: \"{hostile}\"\n    expect: {{result: {{contains: nobody}}}}\n"
        ),
    )
    .unwrap();
    std::fs::rename(world.path("greet.md"), world.path("hostile.md")).unwrap();
    let (code, out, err) = world.test(&[
        "hostile.test.yaml",
        "--host",
        "host.toml",
        "--model",
        "a",
        "--model",
        "b",
        "--html",
        "hostile.html",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let html = std::fs::read_to_string(world.path("hostile.html")).expect("page");
    assert!(
        !html.contains(hostile),
        "the reply reached the page unescaped"
    );
    assert!(
        !html.contains("<script>document"),
        "the case name reached the page unescaped"
    );
    assert!(
        html.contains("&lt;img/src=x/onerror="),
        "the reply shows as text"
    );
    let browsed = browse(&world.path("hostile.html"), "");
    assert!(browsed.dom.contains("data-ready=\"1\""));
    assert!(
        !browsed.dom.contains("data-pwned=\"1\""),
        "text from a run ran as script"
    );
}

// ---------------------------------------------------------------------------
// The browser (as tests/trace.rs drives it)
// ---------------------------------------------------------------------------

struct Browsed {
    log: String,
    dom: String,
}

fn setup_chromium() {
    static ONCE: Mutex<()> = Mutex::new(());
    let _guard = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/setup.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg("chromium")
        .arg(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-tools"))
        .status()
        .expect("run tests/tools/setup.sh");
    assert!(
        status.success(),
        "tests/tools/setup.sh chromium failed: the HTML grid test needs it (see test.sh)"
    );
}

/// The page's DOM as a headless Chromium loaded it (with `fragment`), and its log.
fn browse(page: &Path, fragment: &str) -> Browsed {
    setup_chromium();
    let dir = page.parent().expect("page folder");
    let url = format!("file://{}{fragment}", page.display());
    let profile = dir.join(format!("profile-{}", rand_suffix()));
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(&url)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium --dump-dom failed");
    Browsed {
        log: String::from_utf8_lossy(&out.stderr).into_owned(),
        dom: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

fn rand_suffix() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}
