//! `promptforge test`: prompt tests for users. A YAML test file ([`format`])
//! holds cases (args, seed, fixtures) and their expectations; each case runs
//! in this process through a `RunSession` ([`run`], [`session`]), `-j` at a
//! time, is checked ([`assert`], [`judge`]), and reported as a line, JSON or
//! JUnit ([`junit`]); `--update` writes the current results back as
//! expectations ([`update`]). docs/testing.md is the user guide.
//!
//! Events and tool calls come from the run itself: a collecting observer
//! ([`session::Collector`]) hears them as the engine reports them.

pub mod assert;
pub mod catalog;
pub mod fixtures;
pub mod format;
pub mod judge;
pub mod junit;
pub mod run;
pub mod session;
pub mod update;
pub mod web;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use serde::Serialize;
use serde_json::Value as Json;

use assert::Failure;
use format::{Expect, Loaded, Malformed, TextMatch};
use run::{Observed, Settings};

/// The boundaries every run reports around its own work (parsing, sections,
/// Lua chunks and teardown, scope checks, waits, captured bodies): `--update`
/// leaves them out of an `events: {}` it fills.
const ROUTINE_EVENT_KINDS: &[&str] = &[
    "parse_started",
    "parse_succeeded",
    "run_started",
    "section_started",
    "section_finished",
    "lua_shared_load_started",
    "lua_shared_load_succeeded",
    "lua_chunk_started",
    "lua_chunk_succeeded",
    "lua_teardown_started",
    "lua_teardown_succeeded",
    "lua_compilation_started",
    "lua_compilation_succeeded",
    "tool_scope_validation_started",
    "tool_scope_validation_succeeded",
    "user_input_wait_started",
    "request",
    "response",
];

/// How to run the loaded cases.
#[derive(Debug, Clone)]
pub struct Options {
    /// Only cases whose `FILE: NAME` contains this.
    pub filter: Option<String>,
    pub update: bool,
    /// Runs per case.
    pub repeat: u32,
    /// A case passes when at least this share of its runs passed.
    pub pass_rate: f64,
    /// Cases running at once.
    pub jobs: usize,
}

/// One case's outcome over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct CaseOutcome {
    pub file: String,
    pub line: usize,
    pub name: String,
    pub passed: bool,
    pub runs: u32,
    pub passes: u32,
    pub pass_rate: f64,
    /// Wall time of all its runs together.
    pub duration_ms: u64,
    /// The first failing run's failed assertions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<Failure>,
    /// Why a run could not be made at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether `--update` rewrote its expectations.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub updated: bool,
}

impl CaseOutcome {
    /// The failures for a person, one after another.
    pub fn details(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if let Some(e) = &self.error {
            parts.push(format!("cannot run: {e}"));
        }
        parts.extend(self.failures.iter().map(Failure::render));
        parts.join("\n")
    }
}

/// The test files under `paths`, in name order, each once. A `.md` path means
/// the test file beside it; a missing path is an error naming it.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut found);
        } else if path.is_file() {
            if path.extension().is_some_and(|e| e == "md") {
                let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
                let beside = path.with_file_name(format!("{stem}.test.yaml"));
                if beside.is_file() {
                    found.push(beside);
                } else {
                    return Err(format!("{} has no {}", path.display(), beside.display()));
                }
            } else {
                found.push(path.clone());
            }
        } else {
            return Err(format!("{}: no such file or folder", path.display()));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    found.retain(|p| seen.insert(p.clone()));
    Ok(found)
}

fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            // Build output, VCS data and dependencies hold no user tests.
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                walk(&p, found);
            }
        } else if format::is_test_file(&p) {
            found.push(p);
        }
    }
}

/// Load every file; all the malformed ones are reported, not only the first.
pub fn load_all(files: &[PathBuf]) -> Result<Vec<Loaded>, Vec<Malformed>> {
    let (mut loaded, mut bad) = (Vec::new(), Vec::new());
    for f in files {
        match format::load(f) {
            Ok(l) => loaded.push(l),
            Err(m) => bad.push(m),
        }
    }
    if bad.is_empty() {
        Ok(loaded)
    } else {
        Err(bad)
    }
}

/// A path for messages: as given, without a leading `./`.
pub fn shown(path: &Path) -> String {
    let text = path.display().to_string();
    text.strip_prefix("./").map(str::to_string).unwrap_or(text)
}

/// One run's verdict, and (with `--update`) the case's new `expect`.
struct Attempt {
    failures: Vec<Failure>,
    error: Option<String>,
    millis: u64,
    new_expect: Option<Json>,
}

/// Run the selected cases in parallel (`jobs` at once), calling `done` with
/// each case's outcome in file and case order as soon as it and those before
/// it are known. With `update`, rewrites the files and reports which.
pub fn run_all(
    settings: &Settings,
    loaded: &[Loaded],
    options: &Options,
    mut done: impl FnMut(&CaseOutcome),
) -> (Vec<CaseOutcome>, Vec<String>) {
    let selected: Vec<(usize, usize)> = loaded
        .iter()
        .enumerate()
        .flat_map(|(f, l)| (0..l.tests.cases.len()).map(move |c| (f, c)))
        .filter(|(f, c)| {
            let id = format!(
                "{}: {}",
                shown(&loaded[*f].file),
                loaded[*f].tests.cases[*c].name
            );
            options
                .filter
                .as_ref()
                .is_none_or(|s| id.contains(s.as_str()))
        })
        .collect();
    let repeat = options.repeat.max(1) as usize;
    let jobs: Vec<(usize, usize)> = (0..selected.len())
        .flat_map(|s| (0..repeat).map(move |r| (s, r)))
        .collect();
    let raw: Vec<Json> = loaded
        .iter()
        .map(|l| serde_norway::from_str(&l.text).unwrap_or(Json::Null))
        .collect();
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(usize, usize, Attempt)>();
    let mut attempts: Vec<Vec<Option<Attempt>>> = (0..selected.len())
        .map(|_| (0..repeat).map(|_| None).collect())
        .collect();
    let mut outcomes: Vec<CaseOutcome> = Vec::new();
    let mut pending: Vec<(usize, usize, usize, Json)> = Vec::new();
    std::thread::scope(|scope| {
        for _ in 0..options.jobs.max(1).min(jobs.len().max(1)) {
            let tx = tx.clone();
            let (next, jobs, selected, raw) = (&next, &jobs, &selected, &raw);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(s, r)) = jobs.get(i) else { break };
                let (f, c) = selected[s];
                let original = &raw[f]["cases"][c]["expect"];
                let attempt = attempt(settings, &loaded[f], c, original, options.update && r == 0);
                if tx.send((s, r, attempt)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        let mut printed = 0;
        for (s, r, a) in rx {
            attempts[s][r] = Some(a);
            while printed < selected.len() && attempts[printed].iter().all(Option::is_some) {
                let (f, c) = selected[printed];
                let runs: Vec<Attempt> = attempts[printed]
                    .iter_mut()
                    .filter_map(Option::take)
                    .collect();
                let (outcome, new_expect) = summarize(&loaded[f], c, runs, options.pass_rate);
                done(&outcome);
                if let Some(e) = new_expect {
                    pending.push((outcomes.len(), f, c, e));
                }
                outcomes.push(outcome);
                printed += 1;
            }
        }
    });
    let updated = if options.update {
        write_updates(loaded, pending, &mut outcomes)
    } else {
        Vec::new()
    };
    (outcomes, updated)
}

/// One run of case `c` of `file`, checked; with `update`, also its new `expect`.
fn attempt(settings: &Settings, file: &Loaded, c: usize, original: &Json, update: bool) -> Attempt {
    let case = &file.tests.cases[c];
    let obs = match run::run_case(settings, file, case) {
        Ok(obs) => obs,
        Err(error) => {
            return Attempt {
                failures: Vec::new(),
                error: Some(error),
                millis: 0,
                new_expect: None,
            }
        }
    };
    let millis = obs.wall.as_millis() as u64;
    let (expect, new_expect) = if update {
        let new = updated_expect(original, &case.expect, &obs);
        match serde_json::from_value::<Expect>(new.clone()) {
            Ok(e) if new != *original => (e, Some(new)),
            _ => (case.expect.clone(), None),
        }
    } else {
        (case.expect.clone(), None)
    };
    let mut failures = assert::check(&expect, &obs);
    if failures.is_empty() {
        failures.extend(judges(settings, &expect, &obs));
    }
    Attempt {
        failures,
        error: None,
        millis,
        new_expect,
    }
}

/// The `judge` assertions: each asks its model about the result.
fn judges(settings: &Settings, expect: &Expect, obs: &Observed) -> Vec<Failure> {
    let Some(judges) = &expect.judge else {
        return Vec::new();
    };
    let result = assert::seen(obs).result;
    let mut bad = Vec::new();
    for j in judges.items() {
        let name = format!("judge[{}]", j.model);
        let verdict = catalog::lookup(settings.host.as_deref(), &j.model)
            .and_then(|m| judge::ask(&m, &j.rubric, &result));
        let problem = match verdict {
            Ok(judge::Verdict::Pass) => continue,
            Ok(judge::Verdict::Fail(reason)) if reason.is_empty() => "the judge said FAIL".into(),
            Ok(judge::Verdict::Fail(reason)) => format!("the judge said FAIL: {reason}"),
            Ok(judge::Verdict::Unclear(reply)) => {
                format!("the judge answered neither PASS nor FAIL: {reply:?}")
            }
            Err(e) => e,
        };
        bad.push(Failure {
            assertion: name,
            message: format!("{problem}\n  rubric: {}", j.rubric),
            expected: None,
            actual: Some(result.clone()),
        });
    }
    bad
}

/// A case's outcome over its runs, and the first run's new `expect` (with `--update`).
fn summarize(
    file: &Loaded,
    c: usize,
    runs: Vec<Attempt>,
    pass_rate: f64,
) -> (CaseOutcome, Option<Json>) {
    let total = runs.len() as u32;
    let passes = runs
        .iter()
        .filter(|a| a.error.is_none() && a.failures.is_empty())
        .count() as u32;
    let rate = if total == 0 {
        0.0
    } else {
        f64::from(passes) / f64::from(total)
    };
    let first_bad = runs
        .iter()
        .find(|a| a.error.is_some() || !a.failures.is_empty());
    let new_expect = runs.first().and_then(|a| a.new_expect.clone());
    let outcome = CaseOutcome {
        file: shown(&file.file),
        line: file.case_lines.get(c).copied().unwrap_or(1),
        name: file.tests.cases[c].name.clone(),
        passed: total > 0 && rate + 1e-9 >= pass_rate,
        runs: total,
        passes,
        pass_rate: rate,
        duration_ms: runs.iter().map(|a| a.millis).sum(),
        failures: first_bad.map(|a| a.failures.clone()).unwrap_or_default(),
        error: first_bad.and_then(|a| a.error.clone()),
        updated: new_expect.is_some(),
    };
    (outcome, new_expect)
}

/// Rewrite each file whose cases got new expectations (`(outcome index,
/// file, case, expect)`); the files written. A file that cannot be rewritten
/// fails its updated cases with the reason.
fn write_updates(
    loaded: &[Loaded],
    pending: Vec<(usize, usize, usize, Json)>,
    outcomes: &mut [CaseOutcome],
) -> Vec<String> {
    let mut by_file: BTreeMap<usize, Vec<(usize, usize, Json)>> = BTreeMap::new();
    for (o, f, c, expect) in pending {
        by_file.entry(f).or_default().push((o, c, expect));
    }
    let mut written = Vec::new();
    for (f, updates) in by_file {
        let file = &loaded[f];
        let edits: Vec<(usize, Json)> = updates.iter().map(|(_, c, e)| (*c, e.clone())).collect();
        let result = update::rewrite(&file.text, &edits).and_then(|text| {
            std::fs::write(&file.file, text)
                .map_err(|e| format!("cannot write {}: {e}", file.file.display()))
        });
        match result {
            Ok(()) => written.push(shown(&file.file)),
            Err(e) => {
                for (o, _, _) in &updates {
                    let outcome = &mut outcomes[*o];
                    outcome.updated = false;
                    outcome.passed = false;
                    outcome.error = Some(format!("--update: {e}"));
                }
            }
        }
    }
    written
}

/// The case's `expect` rewritten from what the run did: the snapshot values
/// (`outcome`, a plain `result`, `error`'s kind and plain message, plain or
/// absent `store` files, `events` counts, `tool_calls`) take the actual
/// values; matchers, `offered`, `budget` and `judge` are assertions and stay.
/// A case without `expect` gets its outcome and result (or error).
pub fn updated_expect(original: &Json, expect: &Expect, obs: &Observed) -> Json {
    let s = assert::seen(obs);
    let result_or_error = |m: &mut serde_json::Map<String, Json>| match &s.error {
        Some((kind, message)) => {
            m.insert(
                "error".into(),
                serde_json::json!({"kind": kind, "message": message}),
            );
        }
        None => {
            m.insert("result".into(), Json::String(s.result.clone()));
        }
    };
    let Json::Object(original) = original else {
        let mut m = serde_json::Map::new();
        if s.outcome == "cancelled" {
            m.insert("outcome".into(), Json::String(s.outcome.into()));
        } else {
            result_or_error(&mut m);
        }
        return Json::Object(m);
    };
    let mut m = original.clone();
    if s.outcome != expect.outcome().as_str() {
        m.insert("outcome".into(), Json::String(s.outcome.into()));
        match s.outcome {
            "completed" => {
                m.shift_remove("error");
                m.entry("result").or_insert(Json::String(s.result.clone()));
            }
            "failed" if !m.contains_key("error") => result_or_error(&mut m),
            _ => {}
        }
        if s.outcome == "failed" {
            m.shift_remove("result");
        }
    }
    if matches!(expect.result, Some(TextMatch::Equals(_))) && s.outcome == "completed" {
        m.insert("result".into(), Json::String(s.result.clone()));
    }
    if let (Some(Json::Object(e)), Some((kind, message))) = (m.get_mut("error"), &s.error) {
        if e.contains_key("kind") {
            e.insert("kind".into(), Json::String(kind.clone()));
        }
        if e.get("message").is_some_and(|v| !v.is_object()) {
            e.insert("message".into(), Json::String(message.clone()));
        }
    }
    if let Some(Json::Object(store)) = m.get_mut("store") {
        for (path, want) in store.iter_mut() {
            if !want.is_object() {
                *want = assert::store_file(obs, path).map_or(Json::Null, Json::String);
            }
        }
    }
    if let Some(Json::Object(events)) = m.get_mut("events") {
        let counts = assert::event_counts(&obs.events);
        if events.is_empty() {
            // What the prompt did, not the engine's routine boundaries every
            // run reports; a case can still name any kind by hand.
            for (kind, n) in counts {
                if !ROUTINE_EVENT_KINDS.contains(&kind.as_str()) {
                    events.insert(kind, n.into());
                }
            }
        } else {
            for (kind, n) in events.iter_mut() {
                *n = counts.get(kind).copied().unwrap_or(0).into();
            }
        }
    }
    if let Some(want) = &expect.tool_calls {
        let bare = !want.is_empty() && want.iter().all(|w| w.bare);
        let calls: Vec<Json> = obs
            .calls
            .iter()
            .cloned()
            .map(|c| match c.arguments.filter(|_| !bare) {
                Some(a) => {
                    let a = serde_json::from_str(&assert::unweb(obs, &a.to_string())).unwrap_or(a);
                    serde_json::json!({"alias": c.alias, "arguments": a})
                }
                None => Json::String(c.alias),
            })
            .collect();
        m.insert("tool_calls".into(), Json::Array(calls));
    }
    Json::Object(m)
}
