#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `promptforge test` through the real binary: passing and failing files,
//! every assertion kind's diff, fixtures, parallel runs, JUnit read back by
//! Python's XML parser, `--update`, malformed files, and live mode with a
//! judge against a local OpenAI-compatible server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

fn write(dir: &Path, name: &str, text: &str) {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(p, text).expect("write a test file");
}

/// `promptforge test ARGS` in `dir`: exit code, stdout, stderr.
fn pf_test(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("test")
        .args(args)
        .current_dir(dir)
        .env_remove("PROMPTFORGE_LOG")
        .env_remove("PROMPTFORGE_HOST")
        // Live runs are logged: into the test's own data directory.
        .env("PROMPTFORGE_HOME", dir.join(".pf-home"))
        .output()
        .expect("run promptforge test");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const ECHO: &str = "---\nname: echo\ndescription: returns its argument string\npromptforge: 0\n---\n\n# Echo\n\n## Only\n\n```lua\nreturn args\n```\n";

const NOTES: &str = r#"---
name: notes
description: the model saves notes through a local tool
promptforge: 0
models:
  w: {}
---

# Notes

## Take

```lua
models.use('w')
tools.add_local('save_note', 'Save one short note', { text = 'string' }, function(a)
  store.append('notes.md', a.text .. '\n')
  return 'saved'
end)
local msgs = messages.new():user('Take notes: ' .. args)
models.loop(msgs)
return msgs[#msgs].content
```
"#;

#[test]
fn a_passing_file_prints_a_line_per_case_and_the_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "echo.md", ECHO);
    write(
        dir.path(),
        "echo.test.yaml",
        "cases:\n  - name: plain\n    args: hi\n    expect:\n      result: hi\n  - name: typed args are JSON\n    args: {query: tide, n: 2}\n    expect:\n      result:\n        json_path:\n          $.query: tide\n          $.n: 2\n",
    );
    let (code, out, err) = pf_test(dir.path(), &[]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("ok     echo.test.yaml: plain ("),
        "{out}"
    );
    assert!(
        lines[1].starts_with("ok     echo.test.yaml: typed args are JSON ("),
        "{out}"
    );
    assert_eq!(lines[2], "2 passed, 0 failed");

    let (code, out, _) = pf_test(dir.path(), &["--filter", "typed", "--json"]);
    assert_eq!(code, 0);
    let report: Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(report["passed"], 1);
    assert_eq!(report["cases"][0]["name"], "typed args are JSON");
    assert_eq!(report["cases"][0]["line"], 6);
}

#[test]
fn each_assertion_kind_fails_with_a_clear_diff() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "notes.md", NOTES);
    write(dir.path(), "echo.md", ECHO);
    let replies = "    replies:\n      - tool_calls: [{name: save_note, arguments: {text: one}}]\n      - \"done\\nwith two lines\"\n";
    let case = |name: &str, expect: &str| {
        format!("  - name: {name}\n    args: x\n{replies}    expect:\n{expect}")
    };
    let cases = [
        case("result equals", "      result: \"done\\nwith 2 lines\"\n"),
        case("result contains", "      result: {contains: absent}\n"),
        case("result regex", "      result: {regex: \"^x\"}\n"),
        case("result json", "      result: {json_path: {$.a: 1}}\n"),
        case("outcome", "      outcome: failed\n"),
        case(
            "store",
            "      store: {notes.md: \"two\\n\", other.md: \"x\"}\n",
        ),
        case(
            "tool calls",
            "      tool_calls: [{alias: save_note, arguments: {text: two}}]\n",
        ),
        case(
            "offered tools",
            "      offered: {tools: [save_note, fetch]}\n",
        ),
        case(
            "offered descriptions",
            "      offered: {descriptions: {save_note: Save a note}}\n",
        ),
        case("events", "      events: {tool_call_succeeded: 3}\n"),
        case("rounds", "      budget: {rounds: 1}\n"),
        case("tokens", "      budget: {tokens: 10}\n"),
    ];
    write(
        dir.path(),
        "notes.test.yaml",
        &format!("cases:\n{}", cases.concat()),
    );
    write(
        dir.path(),
        "tests/errors.yaml",
        "prompt: ../notes.md\ncases:\n  - name: error kind\n    expect:\n      error: {kind: Tool}\n  - name: error message\n    expect:\n      error: {message: \"models.use failed\"}\n  - name: error contains\n    expect:\n      error: {message: {contains: nope}}\n  - name: cannot run\n    host_extra: \"[model]\\nprovider = \\\"nothing\\\"\\n\"\n",
    );
    write(
        dir.path(),
        "echo.test.yaml",
        "cases:\n  - name: result not contains\n    args: '{\"a\": [1, {\"b\": \"x\"}]}'\n    expect:\n      result: {not_contains: '\"b\"'}\n  - name: result json path value\n    args: '{\"a\": [1, {\"b\": \"x\"}]}'\n    expect:\n      result:\n        json_path:\n          $.a[1].b: y\n          $.c: 1\n  - name: wall budget\n    args: x\n    expect:\n      budget: {wall_ms: 0}\n",
    );
    let (code, out, err) = pf_test(dir.path(), &["."]);
    assert_eq!(code, 1, "{out}{err}");
    let wanted = [
        "FAILED echo.test.yaml: result not contains",
        "    result contains \"\\\"b\\\"\"\n      actual:   \"{\\\"a\\\": [1, {\\\"b\\\": \\\"x\\\"}]}\"",
        "    result $.a[1].b differs\n      expected: \"\\\"y\\\"\"\n      actual:   \"\\\"x\\\"\"",
        "    result has nothing at $.c\n      expected: \"1\"",
        "FAILED echo.test.yaml: wall budget",
        "    over budget: ",
        " milliseconds, at most 0 allowed\n      expected: \"<= 0\"",
        "FAILED notes.test.yaml: result equals",
        "    result differs (- expected, + actual):\n        done\n      - with 2 lines\n      + with two lines",
        "    result does not contain \"absent\"\n      actual:   \"done\\nwith two lines\"",
        "    result does not match /^x/",
        "    result is not JSON",
        "    outcome differs\n      expected: \"failed\"\n      actual:   \"completed\"",
        "    store.notes.md differs (- expected, + actual):\n      - two\n      + one",
        "    store file other.md does not exist",
        "    tool calls differ (1 expected, 1 made) (- expected, + actual):\n      - save_note {\"text\":\"two\"}\n      + save_note {\"text\":\"one\"}",
        "    request #0 offered other tools (- expected, + actual):\n        save_note\n      - fetch",
        "    offered[request 0].descriptions.save_note differs\n      expected: \"Save a note\"\n      actual:   \"Save one short note\"",
        "    events.tool_call_succeeded differs\n      expected: \"3\"\n      actual:   \"1\"",
        "    over budget: 2 model rounds, at most 1 allowed",
        "    the model reported no token usage, so the token budget cannot be checked",
        "FAILED tests/errors.yaml: error kind",
        "    error.kind differs\n      expected: \"Tool\"\n      actual:   \"Lua\"",
        "    error.message differs\n      expected: \"models.use failed\"\n      actual:   \"section `Take` prologue:",
        "    error.message does not contain \"nope\"",
        "FAILED tests/errors.yaml: cannot run",
        "    outcome differs (the run failed: Usage: host file: [model] provider \"nothing\" is not known",
    ];
    for w in wanted {
        assert!(out.contains(w), "wanted {w:?} in:\n{out}");
    }
    assert!(out.ends_with("0 passed, 19 failed\n"), "{out}");
}

#[test]
fn fixtures_reach_the_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "fix.md",
        r#"---
name: fix
description: reads a page, an MCP tool, a store file and an operator answer
promptforge: 0
plugins:
  - promptforge/web
  - acme/kit
tools:
  fetch: promptforge/web/fetch
  lookup: acme/kit/lookup
---

# Fix

## Only

```lua
local page = tools.call('fetch', { url = args })
local found = tools.call('lookup', { word = 'tide' })
local before = store.read('in.txt')
local answer = input.ask('Topic?')
store.write('out.txt', before .. '+' .. answer)
return (page:find('Fixture page', 1, true) and 'page' or 'no page') .. '|' .. found .. '|' .. answer
```
"#,
    );
    write(
        dir.path(),
        "fix.test.yaml",
        r#"cases:
  - name: every fixture
    args: "{{WEB}}/page.txt"
    answers: [tides]
    store:
      in.txt: before
    web:
      pages:
        /page.txt: {content_type: text/plain, body: Fixture page text}
    mcp:
      acme/kit:
        trusted: true
        tools:
          - name: lookup
            description: Look a word up
            result: {text: "meaning {{ARGS}}"}
    expect:
      result: "page|meaning {\"word\": \"tide\"}|tides"
      store:
        out.txt: before+tides
        missing.txt: null
      tool_calls:
        - {alias: fetch, arguments: {url: "{{WEB}}/page.txt"}}
        - {alias: lookup, arguments: {word: tide}}
      events:
        user_input: 1
"#,
    );
    let (code, out, err) = pf_test(dir.path(), &["fix.md"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.ends_with("1 passed, 0 failed\n"), "{out}");
}

const TALLY: &str = r#"---
name: tally
description: a script and the model both call a local tool
promptforge: 0
models:
  w: {}
---

# Tally

## Count

```lua
models.use('w')
tools.add_local('add', 'Add n to the tally', { n = 'integer' }, function(a)
  var.total = (var.total or 0) + a.n
  return tostring(var.total)
end)
tools.call('add', { n = 2 })
local ok = pcall(tools.call, 'missing', { why = 'not bound' })
local msgs = messages.new():user('Add more: ' .. args)
models.loop(msgs)
tools.call('add', { n = 10 })
return tostring(var.total)
```
"#;

#[test]
fn script_and_model_tool_calls_are_checked_with_their_arguments() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "tally.md", TALLY);
    let case = |name: &str, calls: &str| {
        format!(
            "  - name: {name}\n    args: x\n    replies:\n      - tool_calls: [{{name: add, arguments: {{n: 5}}}}]\n      - done\n    expect:\n      result: \"17\"\n      tool_calls:\n{calls}"
        )
    };
    let right = "        - {alias: add, arguments: {n: 2}}\n        - {alias: missing, arguments: {why: not bound}}\n        - {alias: add, arguments: {n: 5}}\n        - {alias: add, arguments: {n: 10}}\n";
    let wrong = "        - {alias: add, arguments: {n: 2}}\n        - missing\n        - {alias: add, arguments: {n: 5}}\n        - {alias: add, arguments: {n: 1}}\n";
    write(
        dir.path(),
        "tally.test.yaml",
        &format!(
            "cases:\n{}{}{}",
            case("every call with its arguments", right),
            case(
                "aliases only",
                "        - add\n        - missing\n        - add\n        - add\n"
            ),
            case("a script call's arguments differ", wrong)
        ),
    );
    let (code, out, err) = pf_test(dir.path(), &["."]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("ok     tally.test.yaml: every call with its arguments"),
        "{out}"
    );
    assert!(
        out.contains("ok     tally.test.yaml: aliases only"),
        "{out}"
    );
    assert!(
        out.contains("FAILED tally.test.yaml: a script call's arguments differ"),
        "{out}"
    );
    assert!(
        out.contains("    tool calls differ (4 expected, 4 made) (- expected, + actual):\n        add {\"n\":2}\n        missing\n        add {\"n\":5}\n      - add {\"n\":1}\n      + add {\"n\":10}\n"),
        "{out}"
    );
    assert!(out.ends_with("2 passed, 1 failed\n"), "{out}");
}

#[test]
fn a_case_runs_with_its_seed_and_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "when.md",
        "---\nname: when\ndescription: d\npromptforge: 0\n---\n\n# When\n\n## Only\n\n```lua\nreturn sys.when .. ' ' .. sys.execution\n```\n",
    );
    // What `run` gives with that seed and start is what the case must see.
    let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .arg("run")
        .arg(dir.path().join("when.md"))
        .args(["--seed", "42", "--start", "2030-05-06T07:08:09Z"])
        .env("PROMPTFORGE_HOME", dir.path().join("home"))
        .output()
        .expect("run");
    let expected = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
    assert!(expected.starts_with("2030-05-06"), "{expected}");
    write(
        dir.path(),
        "when.test.yaml",
        &format!("cases:\n  - name: fixed\n    seed: 42\n    start: \"2030-05-06T07:08:09Z\"\n    expect:\n      result: \"{expected}\"\n  - name: another seed\n    seed: 43\n    start: \"2030-05-06T07:08:09Z\"\n    expect:\n      result: \"{expected}\"\n"),
    );
    let (code, out, err) = pf_test(dir.path(), &["."]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("ok     when.test.yaml: fixed"), "{out}");
    assert!(out.contains("FAILED when.test.yaml: another seed"), "{out}");
}

#[test]
fn junit_output_reads_back_through_an_xml_parser() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "echo.md", ECHO);
    write(
        dir.path(),
        "echo.test.yaml",
        "cases:\n  - name: good <one>\n    args: a\n    expect: {result: a}\n  - name: bad & wrong\n    args: a\n    expect: {result: \"b\"}\n",
    );
    let (code, _, _) = pf_test(dir.path(), &["--junit", "report.xml"]);
    assert_eq!(code, 1);
    let read = Command::new("python3")
        .arg("-c")
        .arg(
            "import json, sys, xml.etree.ElementTree as ET\n\
             root = ET.parse(sys.argv[1]).getroot()\n\
             suites = root.findall('testsuite')\n\
             cases = [(c.get('classname'), c.get('name'), [f.get('message') for f in c.findall('failure')], [f.text for f in c.findall('failure')]) for s in suites for c in s.findall('testcase')]\n\
             print(json.dumps({'tag': root.tag, 'tests': root.get('tests'), 'failures': root.get('failures'), 'suites': [s.get('name') for s in suites], 'cases': cases}))",
        )
        .arg(dir.path().join("report.xml"))
        .output()
        .expect("python3");
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let parsed: Value = serde_json::from_slice(&read.stdout).expect("json");
    assert_eq!(parsed["tag"], "testsuites");
    assert_eq!(parsed["tests"], "2");
    assert_eq!(parsed["failures"], "1");
    assert_eq!(parsed["suites"], json!(["echo.test.yaml"]));
    assert_eq!(
        parsed["cases"][0],
        json!(["echo.test.yaml", "good <one>", [], []])
    );
    assert_eq!(parsed["cases"][1][1], "bad & wrong");
    assert_eq!(parsed["cases"][1][2], json!(["result differs"]));
    assert_eq!(
        parsed["cases"][1][3],
        json!(["result differs\n  expected: \"b\"\n  actual:   \"a\""])
    );
}

#[test]
fn update_rewrites_only_the_snapshots() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "notes.md", NOTES);
    let before = "# keep this comment\ncases:\n  - name: snapshot   # and this one\n    args: x\n    replies:\n      - tool_calls: [{name: save_note, arguments: {text: one}}]\n      - |-\n        all\n        done\n    expect:\n      result: stale\n      store:\n        notes.md: old\n      tool_calls: [save_note, save_note]\n      events: {}\n      budget: {rounds: 5}\n\n  - name: new case\n    args: x\n    replies: [fine]\n  - name: matcher stays\n    args: x\n    replies: [fine]\n    expect:\n      result: {contains: fin}\n";
    write(dir.path(), "notes.test.yaml", before);
    let (code, out, err) = pf_test(dir.path(), &["--update"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("updated notes.test.yaml"), "{err}");
    assert!(
        out.contains("snapshot (") && out.contains("[updated]"),
        "{out}"
    );
    let after = std::fs::read_to_string(dir.path().join("notes.test.yaml")).expect("read");
    assert_eq!(
        after,
        "# keep this comment\ncases:\n  - name: snapshot   # and this one\n    args: x\n    replies:\n      - tool_calls: [{name: save_note, arguments: {text: one}}]\n      - |-\n        all\n        done\n    expect:\n      result: |-\n        all\n        done\n      store:\n        notes.md: |\n          one\n      tool_calls:\n      - save_note\n      events:\n        assistant_reply: 1\n        assistant_tool_calls: 1\n        model_turn_completed: 2\n        run_succeeded: 1\n        store_append_succeeded: 1\n        tool_call_succeeded: 1\n        tool_result: 1\n      budget:\n        rounds: 5\n\n  - name: new case\n    args: x\n    replies: [fine]\n    expect:\n      result: fine\n  - name: matcher stays\n    args: x\n    replies: [fine]\n    expect:\n      result: {contains: fin}\n"
    );
    let (code, out, _) = pf_test(dir.path(), &[]);
    assert_eq!(code, 0, "{out}");
    let (code, _, err) = pf_test(dir.path(), &["--update"]);
    assert_eq!(code, 0);
    assert!(
        !err.contains("updated"),
        "a passing file is left alone: {err}"
    );
}

#[test]
fn a_malformed_file_names_its_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "echo.md", ECHO);
    write(
        dir.path(),
        "echo.test.yaml",
        "cases:\n  - name: typo\n    expect:\n      reslt: hi\n",
    );
    write(
        dir.path(),
        "tests/orphan.yaml",
        "prompt: ../missing.md\ncases: []\n",
    );
    let (code, out, err) = pf_test(dir.path(), &[]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains(
            "error: ./echo.test.yaml:4: cases[0].expect: unknown field `reslt`, expected one of"
        ),
        "{err}"
    );
    assert!(err.contains("tests/orphan.yaml:1: the prompt"), "{err}");
    assert!(out.is_empty(), "{out}");
}

/// A local OpenAI-compatible server. Judge requests (system message of the
/// judge protocol) get `PASS`/`FAIL` by whether the rubric says "greets";
/// other requests wait until `together` of them are in flight (or 30 s, a
/// bound that only keeps a broken build from hanging), then answer
/// "together N" or "alone".
fn serve(together: usize) -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let gate = Arc::new((Mutex::new(0usize), Condvar::new()));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (log, gate) = (Arc::clone(&log), Arc::clone(&gate));
            std::thread::spawn(move || answer(stream, &log, &gate, together));
        }
    });
    (base, seen)
}

fn answer(
    mut stream: std::net::TcpStream,
    log: &Mutex<Vec<Value>>,
    gate: &(Mutex<usize>, Condvar),
    together: usize,
) {
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
    log.lock().expect("lock").push(body.clone());
    let system = body["messages"][0]["content"].as_str().unwrap_or("");
    let text = if system.starts_with("You grade the output") {
        let question = body["messages"][1]["content"].as_str().unwrap_or("");
        if question.contains("greets") {
            "PASS\nIt does.".to_string()
        } else {
            "FAIL\nIt does not.".to_string()
        }
    } else {
        let (count, wake) = gate;
        let mut n = count.lock().expect("lock");
        *n += 1;
        wake.notify_all();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while *n < together && std::time::Instant::now() < deadline {
            n = wake
                .wait_timeout(n, Duration::from_millis(100))
                .expect("wait")
                .0;
        }
        if *n >= together {
            format!("together {together}")
        } else {
            "alone".to_string()
        }
    };
    let reply = json!({"id": "c", "object": "chat.completion", "model": "live-1",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
    .to_string();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(reply.as_bytes());
}

const ASK: &str = "---\nname: ask\ndescription: one model round\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Ask\n\n## Only\n\n```lua\nmodels.use('w')\nreturn models.infer('Say hello to ' .. args)\n```\n";

#[test]
fn live_mode_runs_cases_against_a_catalog_model_with_a_judge() {
    let (base, seen) = serve(2);
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "ask.md", ASK);
    write(
        dir.path(),
        "host.toml",
        &format!("[model]\nprovider = \"openai\"\nbase_url = \"{base}/v1\"\nmodel = \"live-1\"\n"),
    );
    write(
        dir.path(),
        "ask.test.yaml",
        "cases:\n  - name: greets\n    args: Ada\n    replies: [scripted, ignored]\n    expect:\n      result: {contains: together}\n      budget: {rounds: 1, tokens: 10}\n      judge: {model: live-1, rubric: The output greets Ada.}\n  - name: judged wrong\n    args: Bob\n    expect:\n      judge: {model: live-1, rubric: The output is a poem.}\n",
    );
    let (code, out, err) = pf_test(
        dir.path(),
        &[
            "--host",
            "host.toml",
            "--model",
            "live-1",
            "--repeat",
            "2",
            "--jobs",
            "2",
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("ok     ask.test.yaml: greets (2/2 passed, 100%,"),
        "{out}"
    );
    assert!(
        out.contains("FAILED ask.test.yaml: judged wrong (0/2 passed, 0%,"),
        "{out}"
    );
    assert!(
        out.contains("    the judge said FAIL: It does not.\n      rubric: The output is a poem.\n      actual:   \"together 2\""),
        "{out}"
    );
    assert!(out.ends_with("1 passed, 1 failed\n"), "{out}");
    let seen = seen.lock().expect("lock");
    let judged: Vec<&Value> = seen
        .iter()
        .filter(|b| {
            b["messages"][0]["content"]
                .as_str()
                .is_some_and(|s| s.starts_with("You grade"))
        })
        .collect();
    assert_eq!(judged.len(), 4, "one judge question per run");
    assert_eq!(judged[0]["temperature"], 0.0);
    assert!(judged.iter().all(|b| b["model"] == "live-1"));
}

#[test]
fn cases_run_in_parallel() {
    // Each model request waits for the other: the cases pass only when both
    // runs are in flight at once.
    let (base, _) = serve(2);
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "ask.md", ASK);
    write(
        dir.path(),
        "host.toml",
        &format!("[model]\nprovider = \"openai\"\nbase_url = \"{base}/v1\"\nmodel = \"live-1\"\n"),
    );
    write(
        dir.path(),
        "ask.test.yaml",
        "cases:\n  - name: first\n    model: live-1\n    expect: {result: together 2}\n  - name: second\n    model: live-1\n    expect: {result: together 2}\n",
    );
    let (code, out, err) = pf_test(dir.path(), &["--host", "host.toml", "--jobs", "2"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.ends_with("2 passed, 0 failed\n"), "{out}");
}
