//! The assertions: each expectation of a case against what one run did.
//! A failure carries the expected and the actual text, rendered as
//! `expected … / actual …`, or as a line diff when either side spans lines.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value as Json;

use super::format::{Expect, Matchers, Offered, TextMatch, ToolCallExpect};
use super::run::{Observed, NO_WEB};
pub use super::session::CallMade;
use pf_engine::{Event, RunEvent};
use pf_host::report::ReportOutcome;

/// One expectation that did not hold.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// Which expectation: `result`, `error.kind`, `store.notes.md`, `tool_calls`, …
    pub assertion: String,
    /// What went wrong, in a sentence.
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual: Option<String>,
}

impl Failure {
    fn new(assertion: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            assertion: assertion.into(),
            message: message.into(),
            expected: None,
            actual: None,
        }
    }

    fn differs(assertion: impl Into<String>, expected: &str, actual: &str) -> Failure {
        let assertion = assertion.into();
        Failure {
            message: format!("{assertion} differs"),
            assertion,
            expected: Some(expected.to_string()),
            actual: Some(actual.to_string()),
        }
    }

    /// The failure for a person: the message, then the values or their diff.
    pub fn render(&self) -> String {
        let mut out = self.message.clone();
        match (&self.expected, &self.actual) {
            (Some(e), Some(a)) if e.contains('\n') || a.contains('\n') => {
                out.push_str(" (- expected, + actual):\n");
                out.push_str(line_diff(e, a).trim_end_matches('\n'));
            }
            (e, a) => {
                if let Some(e) = e {
                    out.push_str(&format!("\n  expected: {}", quote(e)));
                }
                if let Some(a) = a {
                    out.push_str(&format!("\n  actual:   {}", quote(a)));
                }
            }
        }
        out
    }
}

fn quote(s: &str) -> String {
    Json::String(s.to_string()).to_string()
}

/// A line diff of `expected` against `actual`: `-` lines only expected, `+`
/// lines only actual, two spaces for lines both share.
pub fn line_diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    let mut out = String::new();
    if a.len().saturating_mul(b.len()) > 4_000_000 {
        for l in &a {
            out.push_str(&format!("  - {l}\n"));
        }
        for l in &b {
            out.push_str(&format!("  + {l}\n"));
        }
        return out;
    }
    // Longest common subsequence, table from the end.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push_str(&format!("    {}\n", a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push_str(&format!("  - {}\n", a[i]));
            i += 1;
        } else {
            out.push_str(&format!("  + {}\n", b[j]));
            j += 1;
        }
    }
    out
}

/// How many events of each kind the run reported.
pub fn event_counts(events: &[RunEvent]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for e in events {
        *counts.entry(e.kind().as_str().to_string()).or_insert(0) += 1;
    }
    counts
}

/// Tokens the provider reported over the run (`metrics.usage.total_tokens`
/// of every reply that carries it); `None` when no reply did.
pub fn tokens_used(events: &[RunEvent]) -> Option<u64> {
    let counts: Vec<u64> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::AssistantReply(reply) => reply.metrics.as_ref()?.usage,
            _ => None,
        })
        .map(|usage| usage.total_tokens)
        .collect();
    (!counts.is_empty()).then(|| counts.iter().sum())
}

/// The run's result text ("" unless it completed) and error, with the web
/// fixture's address written back as `{{WEB}}`.
pub struct Seen {
    pub outcome: &'static str,
    pub result: String,
    pub error: Option<(String, String)>,
}

pub fn seen(obs: &Observed) -> Seen {
    let (outcome, result, error) = match &obs.report.outcome {
        ReportOutcome::Completed { result } => ("completed", unweb(obs, result), None),
        ReportOutcome::Failed { error } => (
            "failed",
            String::new(),
            Some((error.kind.clone(), unweb(obs, &error.message))),
        ),
        ReportOutcome::Cancelled => ("cancelled", String::new(), None),
    };
    Seen {
        outcome,
        result,
        error,
    }
}

/// `text` with this run's web base written back as `{{WEB}}`.
pub fn unweb(obs: &Observed, text: &str) -> String {
    if obs.base == NO_WEB {
        text.to_string()
    } else {
        text.replace(&obs.base, "{{WEB}}")
    }
}

/// A store file's text after the run, `None` when absent.
pub fn store_file(obs: &Observed, path: &str) -> Option<String> {
    std::fs::read_to_string(obs.store.join(path))
        .ok()
        .map(|t| unweb(obs, &t))
}

/// Every expectation of `e` (but `judge`) that `obs` does not meet.
pub fn check(e: &Expect, obs: &Observed) -> Vec<Failure> {
    let mut bad = Vec::new();
    let s = seen(obs);
    let want = e.outcome().as_str();
    if s.outcome != want {
        let mut f = Failure::differs("outcome", want, s.outcome);
        if let Some((kind, message)) = &s.error {
            f.message = format!("outcome differs (the run failed: {kind}: {message})");
        }
        bad.push(f);
        return bad;
    }
    if let Some(m) = &e.result {
        check_text("result", m, &s.result, &mut bad);
    }
    if let Some(want) = &e.error {
        let (kind, message) = s.error.clone().unwrap_or_default();
        if let Some(k) = &want.kind {
            if *k != kind {
                bad.push(Failure::differs("error.kind", k, &kind));
            }
        }
        if let Some(m) = &want.message {
            check_text("error.message", m, &message, &mut bad);
        }
    }
    for (path, want) in &e.store {
        let got = store_file(obs, path);
        let name = format!("store.{path}");
        match (want, got) {
            (None, None) => {}
            (None, Some(text)) => {
                let mut f = Failure::new(name, format!("store file {path} exists, wanted none"));
                f.actual = Some(text);
                bad.push(f);
            }
            (Some(_), None) => bad.push(Failure::new(
                name,
                format!("store file {path} does not exist"),
            )),
            (Some(m), Some(text)) => check_text(&name, m, &text, &mut bad),
        }
    }
    if let Some(want) = &e.tool_calls {
        check_calls(want, &obs.calls, obs, &mut bad);
    }
    if let Some(offered) = &e.offered {
        for o in offered.items() {
            check_offered(o, &obs.requests, &mut bad);
        }
    }
    if let Some(want) = &e.events {
        let counts = event_counts(&obs.events);
        for (kind, n) in want {
            let got = counts.get(kind).copied().unwrap_or(0);
            if got != *n {
                bad.push(Failure::differs(
                    format!("events.{kind}"),
                    &n.to_string(),
                    &got.to_string(),
                ));
            }
        }
    }
    if let Some(b) = &e.budget {
        let rounds = obs.requests.len() as u64;
        if let Some(max) = b.rounds {
            if rounds > max {
                bad.push(over("budget.rounds", "model rounds", max, rounds));
            }
        }
        if let Some(max) = b.tokens {
            match tokens_used(&obs.events) {
                Some(used) if used > max => bad.push(over("budget.tokens", "tokens", max, used)),
                Some(_) => {}
                None => bad.push(Failure::new(
                    "budget.tokens",
                    "the model reported no token usage, so the token budget cannot be checked",
                )),
            }
        }
        if let Some(max) = b.wall_ms {
            let ms = obs.wall.as_millis() as u64;
            if ms > max {
                bad.push(over("budget.wall_ms", "milliseconds", max, ms));
            }
        }
    }
    bad
}

fn over(assertion: &str, what: &str, max: u64, used: u64) -> Failure {
    let mut f = Failure::new(
        assertion,
        format!("over budget: {used} {what}, at most {max} allowed"),
    );
    f.expected = Some(format!("<= {max}"));
    f.actual = Some(used.to_string());
    f
}

/// Check `text` against a text expectation.
pub fn check_text(name: &str, m: &TextMatch, text: &str, bad: &mut Vec<Failure>) {
    let matchers = match m {
        TextMatch::Equals(want) => Matchers {
            equals: Some(want.clone()),
            ..Matchers::default()
        },
        TextMatch::Matchers(m) => m.clone(),
    };
    if let Some(want) = &matchers.equals {
        if want != text {
            bad.push(Failure::differs(name, want, text));
        }
    }
    for want in matchers.contains.iter().flat_map(|c| c.items()) {
        if !text.contains(want) {
            let mut f = Failure::new(name, format!("{name} does not contain {}", quote(want)));
            f.actual = Some(text.to_string());
            bad.push(f);
        }
    }
    for unwanted in matchers.not_contains.iter().flat_map(|c| c.items()) {
        if text.contains(unwanted) {
            let mut f = Failure::new(name, format!("{name} contains {}", quote(unwanted)));
            f.actual = Some(text.to_string());
            bad.push(f);
        }
    }
    if let Some(re) = &matchers.regex {
        match regex::Regex::new(re) {
            Ok(r) if r.is_match(text) => {}
            Ok(_) => {
                let mut f = Failure::new(name, format!("{name} does not match /{re}/"));
                f.actual = Some(text.to_string());
                bad.push(f);
            }
            Err(e) => bad.push(Failure::new(name, format!("bad regex {re:?}: {e}"))),
        }
    }
    if let Some(paths) = &matchers.json_path {
        let doc: Json = match serde_json::from_str(text) {
            Ok(doc) => doc,
            Err(e) => {
                let mut f = Failure::new(name, format!("{name} is not JSON ({e})"));
                f.actual = Some(text.to_string());
                bad.push(f);
                return;
            }
        };
        for (path, want) in paths {
            let label = format!("{name} {path}");
            match json_path(&doc, path) {
                Err(e) => bad.push(Failure::new(label, e)),
                Ok(None) => {
                    let mut f = Failure::new(label, format!("{name} has nothing at {path}"));
                    f.expected = Some(pretty(want));
                    bad.push(f);
                }
                Ok(Some(got)) if got != want => {
                    bad.push(Failure::differs(label, &pretty(want), &pretty(got)))
                }
                Ok(Some(_)) => {}
            }
        }
    }
}

fn pretty(v: &Json) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// The value at a JSON path: `$`, then `.key`, `["key"]` or `[N]` steps.
pub fn json_path<'d>(doc: &'d Json, path: &str) -> Result<Option<&'d Json>, String> {
    let bad = || format!("bad JSON path {path:?}: use $, .key, [\"key\"] and [N] steps");
    let rest = path.strip_prefix('$').ok_or_else(bad)?;
    let mut at = doc;
    let mut rest = rest;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            if key.is_empty() {
                return Err(bad());
            }
            match at.get(key) {
                Some(v) => at = v,
                None => return Ok(None),
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').ok_or_else(bad)?;
            let inner = &r[..end];
            let next = if let Ok(i) = inner.parse::<usize>() {
                at.get(i)
            } else {
                let key: String = serde_json::from_str(inner)
                    .or_else(|_| serde_json::from_str(&inner.replace('\'', "\"")))
                    .map_err(|_| bad())?;
                at.get(key.as_str())
            };
            match next {
                Some(v) => at = v,
                None => return Ok(None),
            }
            rest = &r[end + 1..];
        } else {
            return Err(bad());
        }
    }
    Ok(Some(at))
}

fn calls_text(calls: &[(String, Option<Json>)]) -> String {
    calls
        .iter()
        .map(|(alias, args)| match args {
            Some(a) => format!("{alias} {a}"),
            None => alias.clone(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn check_calls(want: &[ToolCallExpect], made: &[CallMade], obs: &Observed, bad: &mut Vec<Failure>) {
    // Compare as text, showing arguments only where the expectation gives them.
    let expected: Vec<(String, Option<Json>)> = want
        .iter()
        .map(|w| (w.alias.clone(), w.arguments.clone()))
        .collect();
    let actual: Vec<(String, Option<Json>)> =
        made.iter()
            .enumerate()
            .map(|(i, m)| {
                let shown = want.get(i).is_some_and(|w| w.arguments.is_some())
                    || i >= want.len() && m.arguments.is_some();
                let args = m.arguments.as_ref().filter(|_| shown).map(|a| {
                    serde_json::from_str(&unweb(obs, &a.to_string())).unwrap_or(a.clone())
                });
                (m.alias.clone(), args)
            })
            .collect();
    if expected != actual {
        let mut f = Failure::differs("tool_calls", &calls_text(&expected), &calls_text(&actual));
        f.message = format!(
            "tool calls differ ({} expected, {} made)",
            expected.len(),
            actual.len()
        );
        // Always a line diff: one call per line.
        if let (Some(e), Some(a)) = (&mut f.expected, &mut f.actual) {
            e.push('\n');
            a.push('\n');
        }
        bad.push(f);
    }
}

fn check_offered(o: &Offered, requests: &[Json], bad: &mut Vec<Failure>) {
    let i = o.request;
    let name = format!("offered[request {i}]");
    let Some(q) = requests.get(i) else {
        bad.push(Failure::new(
            name,
            format!("no model request #{i} ({} recorded)", requests.len()),
        ));
        return;
    };
    let tools: Vec<&Json> = q["tools"].as_array().into_iter().flatten().collect();
    let names: Vec<String> = tools
        .iter()
        .map(|t| {
            t["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    if let Some(want) = &o.tools {
        if *want != names {
            let mut f =
                Failure::differs(format!("{name}.tools"), &want.join("\n"), &names.join("\n"));
            f.message = format!("request #{i} offered other tools");
            if let (Some(e), Some(a)) = (&mut f.expected, &mut f.actual) {
                e.push('\n');
                a.push('\n');
            }
            bad.push(f);
        }
    }
    if let Some(want) = &o.messages {
        check_text(&format!("{name}.messages"), want, &messages_text(q), bad);
    }
    for (tool, want) in &o.descriptions {
        let got = tools
            .iter()
            .find(|t| t["function"]["name"] == tool.as_str())
            .map(|t| t["function"]["description"].as_str().unwrap_or_default());
        match got {
            None => bad.push(Failure::new(
                format!("{name}.descriptions.{tool}"),
                format!(
                    "request #{i} did not offer {tool} (offered: {})",
                    names.join(", ")
                ),
            )),
            Some(got) if got != want => bad.push(Failure::differs(
                format!("{name}.descriptions.{tool}"),
                want,
                got,
            )),
            Some(_) => {}
        }
    }
}

/// A recorded request's messages as `offered.messages` reads them: each
/// `ROLE: CONTENT` (a content list's text parts joined), blank lines between.
fn messages_text(request: &Json) -> String {
    let content = |m: &Json| match &m["content"] {
        Json::String(s) => s.clone(),
        Json::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        Json::Null => String::new(),
        other => other.to_string(),
    };
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| format!("{}: {}", m["role"].as_str().unwrap_or("?"), content(m)))
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_line_diff_marks_each_side() {
        assert_eq!(
            line_diff("a\nb\nc", "a\nB\nc\nd"),
            "    a\n  - b\n  + B\n    c\n  + d\n"
        );
    }

    #[test]
    fn json_paths_step_through_keys_and_indexes() {
        let doc = json!({"a": {"b": [10, {"c d": true}]}});
        assert_eq!(json_path(&doc, "$.a.b[0]"), Ok(Some(&json!(10))));
        assert_eq!(json_path(&doc, "$.a.b[1][\"c d\"]"), Ok(Some(&json!(true))));
        assert_eq!(json_path(&doc, "$.a.b[1]['c d']"), Ok(Some(&json!(true))));
        assert_eq!(json_path(&doc, "$"), Ok(Some(&doc)));
        assert_eq!(json_path(&doc, "$.x"), Ok(None));
        assert!(json_path(&doc, "a.b").is_err());
    }

    #[test]
    fn no_events_used_no_tokens() {
        assert_eq!(tokens_used(&[]), None);
    }
}
