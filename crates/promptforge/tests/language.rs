//! The language tests are data: every folder under `tests/data/` holding a
//! `prompt.md` and a `case.json` is one case, run through the real binary
//! exactly as a user runs it. The `case.json` format is the conformance
//! runner's (see the README's "Language tests" section); this runner supports
//! everything but the `web` and `mcp` fixtures, which the plugin crates test.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

fn cases(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
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

struct RunOutput {
    report: Value,
    requests: Vec<Value>,
    store: PathBuf,
}

fn run_case(dir: &Path, case: &Value, work: &Path, seed: u64) -> Result<RunOutput, String> {
    let prompt = std::fs::read_to_string(dir.join("prompt.md")).map_err(|e| e.to_string())?;
    let prompt_file = work.join("prompt.md");
    std::fs::write(&prompt_file, prompt).map_err(|e| e.to_string())?;
    let record = work.join("requests.jsonl");
    let _ = std::fs::remove_file(&record);
    let mut host: Vec<String> = Vec::new();
    if let Some(model) = case.get("model") {
        let replies = work.join("replies.json");
        std::fs::write(&replies, model.get("replies").cloned().unwrap_or(json!([])).to_string()).map_err(|e| e.to_string())?;
        host.push("[model]".into());
        host.push("provider = \"script\"".into());
        host.push(format!("model = {}", toml_str(model.get("id").and_then(Value::as_str).unwrap_or("scripted-model"))));
        host.push(format!("context = {}", model.get("context").and_then(Value::as_u64).unwrap_or(128_000)));
        host.push(format!("thinking = {}", toml_str(model.get("thinking").and_then(Value::as_str).unwrap_or("Switchable"))));
        host.push(format!("replies = {}", toml_str(&replies.to_string_lossy())));
        host.push(format!("record = {}", toml_str(&record.to_string_lossy())));
        if let Some(d) = model.get("description").and_then(Value::as_str) {
            host.push(format!("description = {}", toml_str(d)));
        }
        host.push(String::new());
    }
    if let Some(answers) = case.get("input").and_then(Value::as_array) {
        let list: Vec<String> = answers.iter().map(|a| toml_str(a.as_str().unwrap_or(""))).collect();
        host.push("[input]".into());
        host.push(format!("answers = [{}]", list.join(", ")));
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
    cmd.arg("--host").arg(&host_file).arg("--seed").arg(seed.to_string());
    cmd.arg("--start").arg(case.get("start").and_then(Value::as_str).unwrap_or("2026-01-02T03:04:05Z"));
    cmd.arg("--store").arg(&store).arg("--json");
    let out = cmd.output().map_err(|e| format!("cannot run the binary: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("");
    let report: Value = serde_json::from_str(last).map_err(|_| {
        format!("no JSON report (exit {:?}): {stdout:?} {:?}", out.status.code(), String::from_utf8_lossy(&out.stderr))
    })?;
    let requests = std::fs::read_to_string(&record)
        .map(|t| t.lines().filter(|l| !l.trim().is_empty()).filter_map(|l| serde_json::from_str(l).ok()).collect())
        .unwrap_or_default();
    Ok(RunOutput { report, requests, store })
}

fn check(case: &Value, out: &RunOutput) -> Vec<String> {
    let mut bad = Vec::new();
    let e = case.get("expect").cloned().unwrap_or(json!({}));
    let report = &out.report;
    let want_outcome = e.get("outcome").and_then(Value::as_str).unwrap_or("completed");
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
    for s in e.get("result_contains").and_then(Value::as_array).into_iter().flatten() {
        let s = s.as_str().unwrap_or("");
        if !result.contains(s) {
            bad.push(format!("result lacks {s:?}: {result:?}"));
        }
    }
    if let Some(k) = e.get("error_kind").and_then(Value::as_str) {
        if err.get("kind").and_then(Value::as_str) != Some(k) {
            bad.push(format!("error kind {:?}, wanted {k:?} ({msg:?})", err.get("kind")));
        }
    }
    if let Some(m) = e.get("error_message").and_then(Value::as_str) {
        if msg != m {
            bad.push(format!("error message {msg:?}, wanted {m:?}"));
        }
    }
    for s in e.get("error_contains").and_then(Value::as_array).into_iter().flatten() {
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
    for r in e.get("requests").and_then(Value::as_array).into_iter().flatten() {
        let i = r.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let Some(q) = out.requests.get(i) else {
            bad.push(format!("no model request #{i}"));
            continue;
        };
        let tools: Vec<Value> = q.get("tools").and_then(Value::as_array).cloned().unwrap_or_default();
        let names: Vec<Value> = tools.iter().map(|t| t["function"]["name"].clone()).collect();
        if let Some(want) = r.get("tools") {
            if Value::Array(names.clone()) != *want {
                bad.push(format!("request #{i} offered {names:?}, wanted {want}"));
            }
        }
        if r.get("no_tools").and_then(Value::as_bool) == Some(true) && !tools.is_empty() {
            bad.push(format!("request #{i} offered tools {names:?}, wanted none"));
        }
        for (k, v) in r.get("tool_descriptions").and_then(Value::as_object).into_iter().flatten() {
            let got = tools.iter().find(|t| t["function"]["name"] == json!(k)).map(|t| t["function"]["description"].clone());
            if got.as_ref() != Some(v) {
                bad.push(format!("request #{i} describes {k} as {got:?}, wanted {v}"));
            }
        }
        for (k, v) in r.get("tool_schema").and_then(Value::as_object).into_iter().flatten() {
            let got = tools.iter().find(|t| t["function"]["name"] == json!(k)).map(|t| t["function"]["parameters"].clone());
            if got.as_ref() != Some(v) {
                bad.push(format!("request #{i} schema of {k} is {got:?}, wanted {v}"));
            }
        }
        let msgs: Vec<Value> = q.get("messages").and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(want) = r.get("messages_roles") {
            let roles: Vec<Value> = msgs.iter().map(|m| m["role"].clone()).collect();
            if Value::Array(roles.clone()) != *want {
                bad.push(format!("request #{i} message roles {roles:?}, wanted {want}"));
            }
        }
        for pair in r.get("message_contains").and_then(Value::as_array).into_iter().flatten() {
            let idx = pair[0].as_u64().unwrap_or(0) as usize;
            let want = pair[1].as_str().unwrap_or("");
            let content = msgs.get(idx).map(|m| match &m["content"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
            if !content.as_deref().unwrap_or("").contains(want) {
                bad.push(format!("request #{i} message {idx} lacks {want:?}: {content:?}"));
            }
        }
    }
    for (path, want) in e.get("store").and_then(Value::as_object).into_iter().flatten() {
        let got = std::fs::read_to_string(out.store.join(path)).ok();
        let want = want.as_str().map(str::to_string);
        if got != want {
            bad.push(format!("store file {path}: {got:?}, wanted {want:?}"));
        }
    }
    bad
}

fn key(r: &Value) -> (Value, Value, Value) {
    (r["outcome"].clone(), r["result"].clone(), r["error"].clone())
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
            if case.get("web").is_some() || case.get("mcp").is_some() {
                return Err("web and mcp fixtures are not supported by this runner".into());
            }
            let seed = case.get("seed").and_then(Value::as_u64).unwrap_or(7);
            let first = run_case(dir, &case, work.path(), seed)?;
            let mut bad = check(&case, &first);
            let e = &case["expect"];
            if bad.is_empty() && e["same_seed_same_result"] == json!(true) {
                let again = run_case(dir, &case, work.path(), seed)?;
                if key(&again.report) != key(&first.report) {
                    bad.push("the same seed gave a different report".into());
                }
            }
            if bad.is_empty() && e["other_seed_other_result"] == json!(true) {
                let other = run_case(dir, &case, work.path(), seed + 1)?;
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
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), all.len(), failures.join("\n"));
}
