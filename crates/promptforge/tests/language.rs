//! The language tests are data: every folder under `tests/data/` holding a
//! `prompt.md` and a `case.json` is one case, run through the real binary
//! exactly as a user runs it. The `case.json` format is the conformance
//! runner's (see the README's "Language tests" section); this runner supports
//! everything but the `web` and `mcp` fixtures, which the plugin crates test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::{json, Value};

fn cases(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.join("case.json").is_file() {
            out.push(p);
        } else if p.is_dir() {
            cases(&p, out);
        }
    }
}

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// A local web server for `web` fixtures: `pages` by path, `search` for `/search`.
struct Web {
    base: String,
}

fn start_web(spec: Value) -> Result<Web, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let spec = Arc::new(spec);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let spec = Arc::clone(&spec);
            std::thread::spawn(move || {
                let mut reader = BufReader::new(match stream.try_clone() {
                    Ok(s) => s,
                    Err(_) => return,
                });
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    return;
                }
                let mut parts = line.split_whitespace();
                let method = parts.next().unwrap_or("").to_string();
                let target = parts.next().unwrap_or("/").to_string();
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
                let path = target.split('?').next().unwrap_or("/").to_string();
                let mut page = spec.get("pages").and_then(|p| p.get(&path)).cloned();
                if (path == "/search" || method == "POST") && spec.get("search").is_some() {
                    let mut s = spec["search"].clone();
                    s["content_type"] = json!("application/json");
                    page = Some(s);
                }
                let page = page.unwrap_or(
                    json!({"status": 404, "body": "not found", "content_type": "text/plain"}),
                );
                let body = match &page["body"] {
                    Value::String(s) => s.clone().into_bytes(),
                    Value::Null => Vec::new(),
                    other => other.to_string().into_bytes(),
                };
                let status = page["status"].as_u64().unwrap_or(200);
                let ctype = page["content_type"]
                    .as_str()
                    .unwrap_or("text/html; charset=utf-8");
                let head = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body);
            });
        }
    });
    Ok(Web {
        base: format!("http://{addr}"),
    })
}

fn substitute(v: &Value, base: &str) -> Value {
    match v {
        Value::String(s) => Value::String(s.replace("{{WEB}}", base)),
        Value::Array(a) => Value::Array(a.iter().map(|x| substitute(x, base)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), substitute(x, base)))
                .collect(),
        ),
        other => other.clone(),
    }
}

struct RunOutput {
    report: Value,
    requests: Vec<Value>,
    store: PathBuf,
}

fn run_case(
    dir: &Path,
    case: &Value,
    work: &Path,
    seed: u64,
    base: &str,
) -> Result<RunOutput, String> {
    let prompt = std::fs::read_to_string(dir.join("prompt.md"))
        .map_err(|e| e.to_string())?
        .replace("{{WEB}}", base);
    let prompt_file = work.join("prompt.md");
    std::fs::write(&prompt_file, prompt).map_err(|e| e.to_string())?;
    let record = work.join("requests.jsonl");
    let _ = std::fs::remove_file(&record);
    let mut host: Vec<String> = Vec::new();
    if let Some(model) = case.get("model") {
        let replies = work.join("replies.json");
        std::fs::write(
            &replies,
            model
                .get("replies")
                .cloned()
                .unwrap_or(json!([]))
                .to_string(),
        )
        .map_err(|e| e.to_string())?;
        host.push("[model]".into());
        host.push("provider = \"script\"".into());
        host.push(format!(
            "model = {}",
            toml_str(
                model
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or("scripted-model")
            )
        ));
        host.push(format!(
            "context = {}",
            model
                .get("context")
                .and_then(Value::as_u64)
                .unwrap_or(128_000)
        ));
        host.push(format!(
            "thinking = {}",
            toml_str(
                model
                    .get("thinking")
                    .and_then(Value::as_str)
                    .unwrap_or("Switchable")
            )
        ));
        host.push(format!(
            "replies = {}",
            toml_str(&replies.to_string_lossy())
        ));
        host.push(format!("record = {}", toml_str(&record.to_string_lossy())));
        if let Some(d) = model.get("description").and_then(Value::as_str) {
            host.push(format!("description = {}", toml_str(d)));
        }
        host.push(String::new());
    }
    if let Some(answers) = case.get("input").and_then(Value::as_array) {
        let list: Vec<String> = answers
            .iter()
            .map(|a| toml_str(a.as_str().unwrap_or("")))
            .collect();
        host.push("[input]".into());
        host.push(format!("answers = [{}]", list.join(", ")));
        host.push(String::new());
    }
    if case.get("web").is_some() {
        host.push("[web]".into());
        host.push("allow_loopback = true".into());
        host.push("search = \"gateway\"".into());
        host.push(format!(
            "search_url = {}",
            toml_str(&format!("{base}/search"))
        ));
        host.push(String::new());
    }
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_fixture.py");
    for (id, m) in case
        .get("mcp")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let tools_file = work.join(format!("mcp-{}.json", id.replace('/', "_")));
        let spec = json!({"fail_start": m.get("fail_start").cloned().unwrap_or(json!(false)), "tools": m.get("tools").cloned().unwrap_or(json!([]))});
        std::fs::write(&tools_file, spec.to_string()).map_err(|e| e.to_string())?;
        let command: Vec<String> = [
            "python3".to_string(),
            fixture.to_string_lossy().into_owned(),
            tools_file.to_string_lossy().into_owned(),
        ]
        .iter()
        .map(|x| toml_str(x))
        .collect();
        let conflicts: Vec<String> = m
            .get("conflicts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| toml_str(c.as_str().unwrap_or("")))
            .collect();
        host.push(format!("[plugins.{}]", toml_str(id)));
        host.push(format!("command = [{}]", command.join(", ")));
        host.push(format!(
            "trusted = {}",
            m.get("trusted").and_then(Value::as_bool).unwrap_or(false)
        ));
        host.push(format!("conflicts = [{}]", conflicts.join(", ")));
        host.push(String::new());
    }
    if let Some(extra) = case.get("host_extra").and_then(Value::as_str) {
        host.push(extra.to_string());
    }
    let host_file = work.join("host.toml");
    std::fs::write(&host_file, host.join("\n") + "\n").map_err(|e| e.to_string())?;
    let store = work.join(format!("store-{seed}"));
    let _ = std::fs::remove_dir_all(&store);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    cmd.arg("run").arg(&prompt_file);
    if let Some(a) = case.get("args").and_then(Value::as_str) {
        cmd.arg(a);
    }
    cmd.arg("--host")
        .arg(&host_file)
        .arg("--seed")
        .arg(seed.to_string());
    cmd.arg("--start").arg(
        case.get("start")
            .and_then(Value::as_str)
            .unwrap_or("2026-01-02T03:04:05Z"),
    );
    cmd.arg("--store").arg(&store).arg("--json");
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run the binary: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("");
    let report: Value = serde_json::from_str(last).map_err(|_| {
        format!(
            "no JSON report (exit {:?}): {stdout:?} {:?}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let requests = std::fs::read_to_string(&record)
        .map(|t| {
            t.lines()
                .filter(|l| !l.trim().is_empty())
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default();
    Ok(RunOutput {
        report,
        requests,
        store,
    })
}

fn check(case: &Value, out: &RunOutput) -> Vec<String> {
    let mut bad = Vec::new();
    let e = case.get("expect").cloned().unwrap_or(json!({}));
    let report = &out.report;
    let want_outcome = e
        .get("outcome")
        .and_then(Value::as_str)
        .unwrap_or("completed");
    if report.get("outcome").and_then(Value::as_str) != Some(want_outcome) {
        bad.push(format!("outcome {}, wanted {want_outcome}", report));
        return bad;
    }
    let result = report.get("result").and_then(Value::as_str).unwrap_or("");
    let err = report.get("error").cloned().unwrap_or(json!({}));
    let msg = err.get("message").and_then(Value::as_str).unwrap_or("");
    if let Some(want) = e.get("result").and_then(Value::as_str) {
        if result != want {
            bad.push(format!("result {result:?}, wanted {want:?}"));
        }
    }
    for s in e
        .get("result_contains")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = s.as_str().unwrap_or("");
        if !result.contains(s) {
            bad.push(format!("result lacks {s:?}: {result:?}"));
        }
    }
    if let Some(k) = e.get("error_kind").and_then(Value::as_str) {
        if err.get("kind").and_then(Value::as_str) != Some(k) {
            bad.push(format!(
                "error kind {:?}, wanted {k:?} ({msg:?})",
                err.get("kind")
            ));
        }
    }
    if let Some(m) = e.get("error_message").and_then(Value::as_str) {
        if msg != m {
            bad.push(format!("error message {msg:?}, wanted {m:?}"));
        }
    }
    for s in e
        .get("error_contains")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = s.as_str().unwrap_or("");
        if !msg.contains(s) {
            bad.push(format!("error message lacks {s:?}: {msg:?}"));
        }
    }
    if let Some(n) = e.get("requests_count").and_then(Value::as_u64) {
        if out.requests.len() as u64 != n {
            bad.push(format!("{} model requests, wanted {n}", out.requests.len()));
        }
    }
    for r in e
        .get("requests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let i = r.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let Some(q) = out.requests.get(i) else {
            bad.push(format!("no model request #{i}"));
            continue;
        };
        let tools: Vec<Value> = q
            .get("tools")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let names: Vec<Value> = tools
            .iter()
            .map(|t| t["function"]["name"].clone())
            .collect();
        if let Some(want) = r.get("tools") {
            if Value::Array(names.clone()) != *want {
                bad.push(format!("request #{i} offered {names:?}, wanted {want}"));
            }
        }
        if r.get("no_tools").and_then(Value::as_bool) == Some(true) && !tools.is_empty() {
            bad.push(format!("request #{i} offered tools {names:?}, wanted none"));
        }
        for (k, v) in r
            .get("tool_descriptions")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let got = tools
                .iter()
                .find(|t| t["function"]["name"] == json!(k))
                .map(|t| t["function"]["description"].clone());
            if got.as_ref() != Some(v) {
                bad.push(format!("request #{i} describes {k} as {got:?}, wanted {v}"));
            }
        }
        for (k, v) in r
            .get("tool_schema")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let got = tools
                .iter()
                .find(|t| t["function"]["name"] == json!(k))
                .map(|t| t["function"]["parameters"].clone());
            if got.as_ref() != Some(v) {
                bad.push(format!("request #{i} schema of {k} is {got:?}, wanted {v}"));
            }
        }
        let msgs: Vec<Value> = q
            .get("messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if let Some(want) = r.get("messages_roles") {
            let roles: Vec<Value> = msgs.iter().map(|m| m["role"].clone()).collect();
            if Value::Array(roles.clone()) != *want {
                bad.push(format!(
                    "request #{i} message roles {roles:?}, wanted {want}"
                ));
            }
        }
        for pair in r
            .get("message_contains")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let idx = pair[0].as_u64().unwrap_or(0) as usize;
            let want = pair[1].as_str().unwrap_or("");
            let content = msgs.get(idx).map(|m| match &m["content"] {
                Value::String(s) => s.clone(),
                other => py_dumps(other),
            });
            if !content.as_deref().unwrap_or("").contains(want) {
                bad.push(format!(
                    "request #{i} message {idx} lacks {want:?}: {content:?}"
                ));
            }
        }
    }
    for (path, want) in e
        .get("store")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let got = std::fs::read_to_string(out.store.join(path)).ok();
        let want = want.as_str().map(str::to_string);
        if got != want {
            bad.push(format!("store file {path}: {got:?}, wanted {want:?}"));
        }
    }
    bad
}

/// JSON text the way Python's `json.dumps` writes it (`", "` and `": "`), as the
/// conformance runner compares non-string message content in that form.
fn py_dumps(v: &Value) -> String {
    match v {
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(py_dumps).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, x)| format!("{}: {}", Value::String(k.clone()), py_dumps(x)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

fn key(r: &Value) -> (Value, Value, Value) {
    (
        r["outcome"].clone(),
        r["result"].clone(),
        r["error"].clone(),
    )
}

#[test]
fn every_data_case_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut all = Vec::new();
    cases(&root, &mut all);
    assert!(!all.is_empty(), "no cases under {}", root.display());
    let mut failures = Vec::new();
    for dir in &all {
        let name = dir.strip_prefix(&root).unwrap_or(dir).display().to_string();
        let work = tempfile::tempdir().expect("a temporary directory");
        let outcome = (|| -> Result<Vec<String>, String> {
            let text = std::fs::read_to_string(dir.join("case.json")).map_err(|e| e.to_string())?;
            let case: Value = serde_json::from_str(&text).map_err(|e| format!("case.json: {e}"))?;
            let base = match case.get("web") {
                Some(spec) => start_web(spec.clone())?.base,
                None => "http://127.0.0.1:9".to_string(),
            };
            let case = substitute(&case, &base);
            let seed = case.get("seed").and_then(Value::as_u64).unwrap_or(7);
            let first = run_case(dir, &case, work.path(), seed, &base)?;
            let mut bad = check(&case, &first);
            let e = &case["expect"];
            if bad.is_empty() && e["same_seed_same_result"] == json!(true) {
                let again = run_case(dir, &case, work.path(), seed, &base)?;
                if key(&again.report) != key(&first.report) {
                    bad.push("the same seed gave a different report".into());
                }
            }
            if bad.is_empty() && e["other_seed_other_result"] == json!(true) {
                let other = run_case(dir, &case, work.path(), seed + 1, &base)?;
                if other.report["result"] == first.report["result"] {
                    bad.push("another seed gave the same result".into());
                }
            }
            Ok(bad)
        })();
        match outcome {
            Ok(bad) if bad.is_empty() => {}
            Ok(bad) => failures.push(format!("{name}: {}", bad.join(" | "))),
            Err(why) => failures.push(format!("{name}: {why}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}
