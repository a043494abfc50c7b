//! Tests of the language as data: every folder holding a `prompt.md` and a
//! `case.json` is one case, run through the real binary exactly as a user runs
//! it (a host file written from the case's fixtures, `run --json`), then
//! checked against the case's expectations.
//!
//! [`Mode::Bless`] (`UPDATE_EXPECT=1`) rewrites a case's snapshot expectations
//! from what the run actually did, as rust-analyzer's `expect-test` does:
//! `outcome` when it differs, and those of `result`, `error_kind`, `error_message`,
//! `requests_count`, `store` and `events` the case already has (add
//! `"events": []` to start an event snapshot). Assertions (`*_contains`,
//! `requests`, the seed checks) are never rewritten.

pub mod case;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;

use case::{Case, Expect};
use pf_host::report::{ReportOutcome, RunReport};
pub use promptforge::usertest::fixtures::WorkDir;
pub use promptforge::usertest::web::{ModelServer, WebServer};

/// What `{{WEB}}` stands for when a case has no web fixture (a closed port).
const NO_WEB: &str = "http://127.0.0.1:9";

/// The variable a `model.responses` provider reads its key from, and the
/// made-up key the runner puts there (a case can check it never shows).
pub const MODEL_KEY_ENV: &str = "PROMPTFORGE_CASE_MODEL_KEY";
pub const MODEL_KEY: &str = "sk-case-fixture-0123456789";

/// Check the expectations, or rewrite the snapshots from the actual run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Check,
    Bless,
}

impl Mode {
    /// `Bless` when `UPDATE_EXPECT` is set (to anything but `0` or nothing).
    pub fn from_env() -> Mode {
        match std::env::var("UPDATE_EXPECT") {
            Ok(v) if !v.is_empty() && v != "0" => Mode::Bless,
            _ => Mode::Check,
        }
    }
}

/// Runs cases through a `promptforge` binary.
#[derive(Debug, Clone)]
pub struct Runner {
    /// The binary under test.
    pub bin: PathBuf,
    /// `mcp_fixture.py`, the stdio MCP server behind `mcp` fixtures.
    pub mcp_fixture: PathBuf,
    /// The Python interpreter that runs it.
    pub python: String,
}

/// What running a tree of cases found.
#[derive(Debug, Default)]
pub struct Summary {
    /// How many cases ran.
    pub cases: usize,
    /// One line per failing case: its name and every problem.
    pub failures: Vec<String>,
    /// The cases whose `case.json` bless mode rewrote.
    pub blessed: Vec<String>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{} of {} cases failed", self.failures.len(), self.cases)?;
        for line in &self.failures {
            writeln!(f, "{line}")?;
        }
        for name in &self.blessed {
            writeln!(f, "blessed {name}")?;
        }
        Ok(())
    }
}

/// Every case folder under `root`, depth first in name order.
pub fn discover(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    walk(root, &mut found);
    found
}

fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.join("case.json").is_file() {
            found.push(p);
        } else if p.is_dir() {
            walk(&p, found);
        }
    }
}

/// What one run of a case produced.
#[derive(Debug)]
pub struct Actual {
    pub report: RunReport,
    /// The recorded model requests (chat-completions shape), in order.
    pub requests: Vec<Json>,
    pub store: PathBuf,
    /// The run's events rendered by [`render_events`], one line each.
    pub events: Vec<String>,
}

impl Runner {
    pub fn new(bin: impl Into<PathBuf>, mcp_fixture: impl Into<PathBuf>) -> Runner {
        Runner {
            bin: bin.into(),
            mcp_fixture: mcp_fixture.into(),
            python: "python3".to_string(),
        }
    }

    /// Run every case under `root`.
    pub fn run_all(&self, root: &Path, mode: Mode) -> Summary {
        let mut summary = Summary::default();
        for dir in discover(root) {
            summary.cases += 1;
            let name = dir.strip_prefix(root).unwrap_or(&dir).display().to_string();
            match self.run_case(&dir, mode) {
                Ok(verdict) => {
                    if verdict.blessed {
                        summary.blessed.push(name.clone());
                    }
                    if !verdict.problems.is_empty() {
                        summary
                            .failures
                            .push(format!("{name}: {}", verdict.problems.join(" | ")));
                    }
                }
                Err(why) => summary.failures.push(format!("{name}: {why}")),
            }
        }
        summary
    }

    /// Run one case folder; in bless mode, rewrite its snapshots first and
    /// report what still fails.
    pub fn run_case(&self, dir: &Path, mode: Mode) -> Result<Verdict, String> {
        let case_file = dir.join("case.json");
        let text = std::fs::read_to_string(&case_file).map_err(|e| e.to_string())?;
        let raw: Json = serde_json::from_str(&text).map_err(|e| format!("case.json: {e}"))?;
        let web_fixture: Option<case::WebFixture> = match raw.get("web") {
            Some(spec) => Some(
                serde_json::from_value(spec.clone()).map_err(|e| format!("case.json: web: {e}"))?,
            ),
            None => None,
        };
        // The server starts before `{{WEB}}` is known, so its own fixture
        // keeps the placeholder; the rest of the case gets the real address.
        let server = web_fixture.map(WebServer::start).transpose()?;
        let base = server.as_ref().map_or(NO_WEB.to_string(), WebServer::base);
        let case: Case = serde_json::from_value(substitute(&raw, "{{WEB}}", &base))
            .map_err(|e| format!("case.json: {e}"))?;
        let work = WorkDir::new()?;
        let first = self.run_once(dir, &case, &work.0, case.seed, &base)?;
        let mut blessed = false;
        let expect = if mode == Mode::Bless {
            let mut updated = raw.clone();
            bless(&mut updated, &case.expect, &first, &base);
            if updated != raw {
                write_case(&case_file, &text, &updated)?;
                blessed = true;
            }
            let reread: Case = serde_json::from_value(substitute(&updated, "{{WEB}}", &base))
                .map_err(|e| format!("case.json: {e}"))?;
            reread.expect
        } else {
            case.expect.clone()
        };
        let mut problems = check(&expect, &first);
        if problems.is_empty() && expect.same_seed_same_result {
            let again = self.run_once(dir, &case, &work.0, case.seed, &base)?;
            if again.report.outcome != first.report.outcome {
                problems.push("the same seed gave a different report".into());
            }
        }
        if problems.is_empty() && expect.other_seed_other_result {
            let other = self.run_once(dir, &case, &work.0, case.seed.wrapping_add(1), &base)?;
            if result_of(&other.report) == result_of(&first.report) {
                problems.push("another seed gave the same result".into());
            }
        }
        drop(server);
        Ok(Verdict { problems, blessed })
    }

    /// One run of the binary with the host file the case's fixtures describe.
    pub fn run_once(
        &self,
        dir: &Path,
        case: &Case,
        work: &Path,
        seed: u64,
        base: &str,
    ) -> Result<Actual, String> {
        let prompt = std::fs::read_to_string(dir.join("prompt.md"))
            .map_err(|e| e.to_string())?
            .replace("{{WEB}}", base);
        let prompt_file = work.join("prompt.md");
        std::fs::write(&prompt_file, prompt).map_err(|e| e.to_string())?;
        let store = work.join(format!("store-{seed}"));
        let _ = std::fs::remove_dir_all(&store);
        let invoked = self.invoke(&Invocation {
            prompt_file: &prompt_file,
            case,
            work,
            seed,
            base,
            store: &store,
            capture_events: case.expect.events.is_some(),
        })?;
        Ok(Actual {
            report: invoked.report,
            requests: invoked.requests,
            store,
            events: render_events(&invoked.stderr),
        })
    }

    /// Where [`Runner::invoke`] has the model record its requests: the host
    /// file it writes names this file for the scripted model, and a caller
    /// that brings its own `[model]` table (in `host_extra`) names it there.
    pub fn record_path(work: &Path) -> PathBuf {
        work.join("requests.jsonl")
    }

    /// `promptforge run --json` of `inv.prompt_file`, in place, against the
    /// host file the case's fixtures describe; the store directory is used as
    /// the caller left it (files placed before the run stay).
    pub fn invoke(&self, inv: &Invocation<'_>) -> Result<Invoked, String> {
        let (case, work) = (inv.case, inv.work);
        let record = Runner::record_path(work);
        let _ = std::fs::remove_file(&record);
        let host_file = work.join("host.toml");
        // A fresh server per run: every run reads the responses from the first.
        let model_server = case
            .model
            .as_ref()
            .and_then(|m| m.responses.clone())
            .map(ModelServer::start)
            .transpose()?;
        let model_base = model_server.as_ref().map(ModelServer::base);
        let host = self.host_file(case, work, &record, inv.base, model_base.as_deref())?;
        std::fs::write(&host_file, host).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("run").arg(inv.prompt_file);
        if let Some(a) = &case.args {
            cmd.arg(a);
        }
        if case.model.as_ref().is_some_and(|m| m.capture) {
            cmd.arg("--capture");
        }
        cmd.arg("--host")
            .arg(&host_file)
            .arg("--seed")
            .arg(inv.seed.to_string())
            .arg("--start")
            .arg(&case.start)
            .arg("--store")
            .arg(inv.store)
            .arg("--json")
            // Each case logs into its own scratch run log, never the user's.
            .env("PROMPTFORGE_HOME", work.join("data"))
            .env(MODEL_KEY_ENV, MODEL_KEY);
        if inv.capture_events {
            // Events reach stderr as debug log lines; only then is stderr read.
            cmd.env(
                "PROMPTFORGE_LOG",
                "promptforge::events=debug,promptforge::tools=debug",
            )
            .env("NO_COLOR", "1");
        }
        let started = std::time::Instant::now();
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.bin.display()))?;
        let elapsed = started.elapsed();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let last = stdout.lines().last().unwrap_or("");
        let report: RunReport = serde_json::from_str(last).map_err(|_| {
            format!(
                "no JSON report (exit {:?}): {stdout:?} {stderr:?}",
                out.status.code()
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
        Ok(Invoked {
            report,
            requests,
            stderr,
            elapsed,
        })
    }

    /// The host file for a case: `stream`, `[model]` (scripted, or a real
    /// provider at `model_base`; recording), `[input]`, `[web]`, one
    /// `[plugins."id"]` per MCP fixture, then `host_extra`.
    fn host_file(
        &self,
        case: &Case,
        work: &Path,
        record: &Path,
        base: &str,
        model_base: Option<&str>,
    ) -> Result<String, String> {
        let mut host: Vec<String> = Vec::new();
        if case.model.as_ref().is_some_and(|m| m.stream) {
            host.push("stream = true".into());
            host.push(String::new());
        }
        if let Some(model) = &case.model {
            host.push("[model]".into());
            match (model_base, model.provider.unwrap_or_default()) {
                (None, _) => {
                    let replies = work.join("replies.json");
                    std::fs::write(&replies, model.replies.to_string())
                        .map_err(|e| e.to_string())?;
                    host.push(format!(
                        "provider = {}",
                        toml_str(pf_models::ProviderName::Script.word())
                    ));
                    host.push(format!(
                        "replies = {}",
                        toml_str(&replies.to_string_lossy())
                    ));
                }
                (Some(url), provider) => {
                    let name = match provider {
                        case::ServedProvider::Openai => pf_models::ProviderName::OpenAi,
                        case::ServedProvider::Anthropic => pf_models::ProviderName::Anthropic,
                    }
                    .word();
                    host.push(format!("provider = {}", toml_str(name)));
                    host.push(format!("base_url = {}", toml_str(url)));
                    host.push(format!("api_key_env = {}", toml_str(MODEL_KEY_ENV)));
                }
            }
            host.push(format!("model = {}", toml_str(&model.id)));
            host.push(format!("context = {}", model.context));
            host.push(format!("thinking = {}", toml_str(&model.thinking)));
            host.push(format!("record = {}", toml_str(&record.to_string_lossy())));
            if let Some(d) = &model.description {
                host.push(format!("description = {}", toml_str(d)));
            }
            host.push(String::new());
        }
        if let Some(answers) = &case.input {
            let list: Vec<String> = answers.iter().map(|a| toml_str(a)).collect();
            host.push("[input]".into());
            host.push(format!("answers = [{}]", list.join(", ")));
            host.push(String::new());
        }
        if case.web.is_some() {
            host.push("[web]".into());
            host.push("allow_loopback = true".into());
            host.push("search = \"gateway\"".into());
            host.push(format!(
                "search_url = {}",
                toml_str(&format!("{base}/search"))
            ));
            host.push(String::new());
        }
        for (id, m) in &case.mcp {
            let tools_file = work.join(format!("mcp-{}.json", id.replace('/', "_")));
            let spec = serde_json::json!({"fail_start": m.fail_start, "tools": m.tools});
            std::fs::write(&tools_file, spec.to_string()).map_err(|e| e.to_string())?;
            let command: Vec<String> = [
                self.python.clone(),
                self.mcp_fixture.to_string_lossy().into_owned(),
                tools_file.to_string_lossy().into_owned(),
            ]
            .iter()
            .map(|x| toml_str(x))
            .collect();
            let conflicts: Vec<String> = m.conflicts.iter().map(|c| toml_str(c)).collect();
            host.push(format!("[plugins.{}]", toml_str(id)));
            host.push(format!("command = [{}]", command.join(", ")));
            host.push(format!("trusted = {}", m.trusted));
            host.push(format!("conflicts = [{}]", conflicts.join(", ")));
            host.push(String::new());
        }
        if let Some(extra) = &case.host_extra {
            host.push(extra.clone());
        }
        Ok(host.join("\n") + "\n")
    }
}

/// What one case came to.
#[derive(Debug)]
pub struct Verdict {
    /// Every expectation that did not hold.
    pub problems: Vec<String>,
    /// Whether bless mode rewrote its `case.json`.
    pub blessed: bool,
}

/// One run for [`Runner::invoke`]: the prompt file (run where it is), the
/// case whose fixtures make the host file, the scratch folder, the seed, what
/// `{{WEB}}` stands for, the store directory, and whether to capture events.
pub struct Invocation<'a> {
    pub prompt_file: &'a Path,
    pub case: &'a Case,
    pub work: &'a Path,
    pub seed: u64,
    pub base: &'a str,
    pub store: &'a Path,
    pub capture_events: bool,
}

/// What [`Runner::invoke`] saw: the report, the recorded model requests, the
/// process's stderr (events are read from it by [`parse_events`]) and how
/// long the process took.
#[derive(Debug)]
pub struct Invoked {
    pub report: RunReport,
    pub requests: Vec<Json>,
    pub stderr: String,
    pub elapsed: std::time::Duration,
}

/// A JSON string is a valid TOML basic string.
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// `v` with `from` replaced by `to` in every string.
fn substitute(v: &Json, from: &str, to: &str) -> Json {
    match v {
        Json::String(s) => Json::String(s.replace(from, to)),
        Json::Array(a) => Json::Array(a.iter().map(|x| substitute(x, from, to)).collect()),
        Json::Object(m) => Json::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), substitute(x, from, to)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The run's events, one line each: `task.seq section: kind {fields}`, read
/// from the `promptforge::events` debug lines on stderr. The execution name
/// (the same on every line) is left out, and wall-clock durations (`*_ms`)
/// read `"<ms>"` so the snapshot is the same on every run.
pub fn render_events(stderr: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for event in parse_events(stderr) {
        let Json::Object(mut event) = event else {
            continue;
        };
        let kind = event.shift_remove("kind").unwrap_or_default();
        event.shift_remove("execution");
        let section = event.shift_remove("section").unwrap_or_default();
        let provenance = event.shift_remove("provenance").unwrap_or_default();
        let mut text = format!(
            "{}.{} {}: {}",
            plain(&provenance["task"]),
            plain(&provenance["seq"]),
            plain(&section),
            plain(&kind)
        );
        if !event.is_empty() {
            text.push(' ');
            text.push_str(&without_durations(Json::Object(event)).to_string());
        }
        lines.push(text);
    }
    lines
}

/// The run's events as the engine writes them (`{"kind", "execution",
/// "section", "provenance", ...fields}`), in order, read from the
/// `promptforge::events` debug lines on stderr.
pub fn parse_events(stderr: &str) -> Vec<Json> {
    stderr
        .lines()
        .filter(|line| !line.contains("{\"tool_call\":"))
        .filter_map(|line| {
            let at = line.find("{\"kind\":")?;
            serde_json::from_str::<Json>(&line[at..])
                .ok()
                .filter(Json::is_object)
        })
        .collect()
}

/// `v` with every number under a key ending in `_ms` replaced by `"<ms>"`.
fn without_durations(v: Json) -> Json {
    match v {
        Json::Object(m) => Json::Object(
            m.into_iter()
                .map(|(k, x)| {
                    let x = if k.ends_with("_ms") && x.is_number() {
                        Json::String("<ms>".into())
                    } else {
                        without_durations(x)
                    };
                    (k, x)
                })
                .collect(),
        ),
        Json::Array(a) => Json::Array(a.into_iter().map(without_durations).collect()),
        other => other,
    }
}

/// A string without its quotes; anything else as JSON.
fn plain(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn result_of(report: &RunReport) -> Option<&str> {
    match &report.outcome {
        ReportOutcome::Completed { result } => Some(result),
        _ => None,
    }
}

fn outcome_name(report: &RunReport) -> &'static str {
    match report.outcome {
        ReportOutcome::Completed { .. } => "completed",
        ReportOutcome::Failed { .. } => "failed",
        ReportOutcome::Cancelled => "cancelled",
    }
}

/// Every expectation in `e` that `actual` does not meet.
pub fn check(e: &Expect, actual: &Actual) -> Vec<String> {
    let mut bad = Vec::new();
    let report = &actual.report;
    let want_outcome = e.outcome.as_str();
    if outcome_name(report) != want_outcome {
        bad.push(format!(
            "outcome {}, wanted {want_outcome}",
            report.to_json_line()
        ));
        return bad;
    }
    let result = result_of(report).unwrap_or("");
    let (kind, msg) = match &report.outcome {
        ReportOutcome::Failed { error } => (Some(error.kind.as_str()), error.message.as_str()),
        _ => (None, ""),
    };
    if let Some(want) = &e.result {
        if result != want {
            bad.push(format!("result {result:?}, wanted {want:?}"));
        }
    }
    for s in &e.result_contains {
        if !result.contains(s.as_str()) {
            bad.push(format!("result lacks {s:?}: {result:?}"));
        }
    }
    if let Some(k) = &e.error_kind {
        if kind != Some(k.as_str()) {
            bad.push(format!("error kind {kind:?}, wanted {k:?} ({msg:?})"));
        }
    }
    if let Some(m) = &e.error_message {
        if msg != m {
            bad.push(format!("error message {msg:?}, wanted {m:?}"));
        }
    }
    for s in &e.error_contains {
        if !msg.contains(s.as_str()) {
            bad.push(format!("error message lacks {s:?}: {msg:?}"));
        }
    }
    if let Some(n) = e.requests_count {
        if actual.requests.len() != n {
            bad.push(format!(
                "{} model requests, wanted {n}",
                actual.requests.len()
            ));
        }
    }
    for r in &e.requests {
        check_request(r, &actual.requests, &mut bad);
    }
    for (path, want) in &e.store {
        let got = std::fs::read_to_string(actual.store.join(path)).ok();
        if got != *want {
            bad.push(format!("store file {path}: {got:?}, wanted {want:?}"));
        }
    }
    if let Some(want) = &e.events {
        if actual.events != *want {
            bad.push(format!(
                "events differ (UPDATE_EXPECT=1 rewrites them):\n--- wanted\n{}\n--- got\n{}",
                want.join("\n"),
                actual.events.join("\n")
            ));
        }
    }
    bad
}

fn check_request(r: &case::RequestExpect, requests: &[Json], bad: &mut Vec<String>) {
    let i = r.index;
    let Some(q) = requests.get(i) else {
        bad.push(format!("no model request #{i}"));
        return;
    };
    let tools: Vec<Json> = q
        .get("tools")
        .and_then(Json::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<Json> = tools
        .iter()
        .map(|t| t["function"]["name"].clone())
        .collect();
    if let Some(want) = &r.tools {
        let want: Vec<Json> = want.iter().map(|n| Json::String(n.clone())).collect();
        if names != want {
            bad.push(format!(
                "request #{i} offered {names:?}, wanted {}",
                Json::Array(want)
            ));
        }
    }
    if r.no_tools && !tools.is_empty() {
        bad.push(format!("request #{i} offered tools {names:?}, wanted none"));
    }
    let tool = |name: &str| tools.iter().find(|t| t["function"]["name"] == *name);
    for (k, v) in &r.tool_descriptions {
        let got = tool(k).map(|t| t["function"]["description"].clone());
        if got.as_ref() != Some(v) {
            bad.push(format!("request #{i} describes {k} as {got:?}, wanted {v}"));
        }
    }
    for (k, v) in &r.tool_schema {
        let got = tool(k).map(|t| t["function"]["parameters"].clone());
        if got.as_ref() != Some(v) {
            bad.push(format!("request #{i} schema of {k} is {got:?}, wanted {v}"));
        }
    }
    let msgs: Vec<Json> = q
        .get("messages")
        .and_then(Json::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(want) = &r.messages_roles {
        let roles: Vec<Json> = msgs.iter().map(|m| m["role"].clone()).collect();
        let want: Vec<Json> = want.iter().map(|n| Json::String(n.clone())).collect();
        if roles != want {
            bad.push(format!(
                "request #{i} message roles {roles:?}, wanted {}",
                Json::Array(want)
            ));
        }
    }
    for (idx, want) in &r.message_contains {
        let content = msgs.get(*idx).map(|m| match &m["content"] {
            Json::String(s) => s.clone(),
            other => py_dumps(other),
        });
        if !content.as_deref().unwrap_or("").contains(want.as_str()) {
            bad.push(format!(
                "request #{i} message {idx} lacks {want:?}: {content:?}"
            ));
        }
    }
}

/// JSON text the way Python's `json.dumps` writes it (`", "` and `": "`), as the
/// conformance runner compares non-string message content in that form.
fn py_dumps(v: &Json) -> String {
    match v {
        Json::Array(a) => format!(
            "[{}]",
            a.iter().map(py_dumps).collect::<Vec<_>>().join(", ")
        ),
        Json::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, x)| format!("{}: {}", Json::String(k.clone()), py_dumps(x)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

/// Rewrite the snapshots in `raw` (the case as written, `{{WEB}}` unexpanded)
/// from `actual`: `outcome` when it differs, the others where `e` has them.
fn bless(raw: &mut Json, e: &Expect, actual: &Actual, base: &str) {
    let Json::Object(case) = raw else { return };
    let expect = case
        .entry("expect")
        .or_insert_with(|| Json::Object(Default::default()));
    let Json::Object(expect) = expect else { return };
    // Values from the run name the fixture server's real address; the case says `{{WEB}}`.
    let snap = |s: &str| {
        Json::String(if base == NO_WEB {
            s.to_string()
        } else {
            s.replace(base, "{{WEB}}")
        })
    };
    let report = &actual.report;
    if outcome_name(report) != e.outcome.as_str() {
        expect.insert("outcome".into(), Json::String(outcome_name(report).into()));
    }
    if e.result.is_some() {
        expect.insert("result".into(), snap(result_of(report).unwrap_or("")));
    }
    let (kind, msg) = match &report.outcome {
        ReportOutcome::Failed { error } => (error.kind.as_str(), error.message.as_str()),
        _ => ("", ""),
    };
    if e.error_kind.is_some() {
        expect.insert("error_kind".into(), snap(kind));
    }
    if e.error_message.is_some() {
        expect.insert("error_message".into(), snap(msg));
    }
    if e.requests_count.is_some() {
        expect.insert("requests_count".into(), actual.requests.len().into());
    }
    if let Some(Json::Object(store)) = expect.get_mut("store") {
        for (path, want) in store.iter_mut() {
            *want = match std::fs::read_to_string(actual.store.join(path)) {
                Ok(text) => snap(&text),
                Err(_) => Json::Null,
            };
        }
    }
    if e.events.is_some() {
        let events = actual.events.iter().map(|line| snap(line)).collect();
        expect.insert("events".into(), Json::Array(events));
    }
}

/// Write `case` back in the indentation the file already uses.
fn write_case(path: &Path, old_text: &str, case: &Json) -> Result<(), String> {
    use serde::Serialize;
    let indent = old_text
        .lines()
        .nth(1)
        .map(|l| l.len() - l.trim_start().len())
        .filter(|n| *n > 0)
        .unwrap_or(2);
    let indent = " ".repeat(indent);
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    case.serialize(&mut serializer)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    out.push(b'\n');
    std::fs::write(path, out).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
