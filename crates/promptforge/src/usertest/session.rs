//! One case run in this process: its fixtures become a host file's tables
//! (typed TOML values, never text put together by hand), checked by the
//! Host's own [`HostConfig::from_file`], and the prompt runs through a
//! [`RunSession`] with a [`Collector`] watching: the events and tool calls
//! the assertions read come from the run itself, not from a log.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pf_engine::{Event, RunEvent, RunObserver, ToolCallNotice};
use pf_harness::{CancellationToken, InputBroker, WorkId};
use pf_host::file::HostFile;
use pf_host::report::RunReport;
use pf_host::session::{PlanArgs, RunPlan, RunSession, RunSettings, SettingsFlags};
use pf_host::HostConfig;
use serde_json::Value as Json;
use toml::{Table, Value};

/// A tool call the run made: by the model (with its arguments) or by a script.
#[derive(Debug, Clone, PartialEq)]
pub struct CallMade {
    pub alias: String,
    pub arguments: Option<Json>,
}

/// Everything one in-process run of a case needs.
pub struct CaseRun<'a> {
    pub prompt_file: &'a Path,
    /// The case's host file, as tables.
    pub host: Table,
    /// The case's own host-file text (`host:`), merged into `host`.
    pub host_extra: Option<String>,
    /// The folder relative paths in `host` are read against.
    pub host_dir: &'a Path,
    pub args: Option<String>,
    pub seed: u64,
    /// RFC 3339.
    pub start: &'a str,
    pub store: &'a Path,
    /// Keep the run in the run log (a matrix cell, `--model`, `--cache`).
    pub log: bool,
    /// The `promptforge test` invocation the logged run belongs to.
    pub batch: Option<String>,
    /// Answer model rounds from earlier logged exchanges (`--cache`).
    pub cache: Option<pf_host::cache::CacheUse>,
    pub cancel: CancellationToken,
}

/// What the run did, as the assertions see it.
pub struct CaseRunEnd {
    pub report: RunReport,
    /// The run's events as the engine reports them, in order.
    pub events: Vec<RunEvent>,
    pub calls: Vec<CallMade>,
    pub elapsed: Duration,
    /// A logged run's end, settled once every cell has run.
    pub logged: Option<pf_host::session::Finished>,
}

/// Run the case's prompt in place against its host tables (a `!Send`
/// future: the executor runs it on its own task). A host file or command
/// line `promptforge run` would refuse (exit 2) is a failed report of kind
/// `Usage`, as `run --json` reports it.
pub async fn run(case: CaseRun<'_>) -> Result<CaseRunEnd, String> {
    let began = Instant::now();
    match run_checked(case).await {
        Err(Refused::Usage(message)) => Ok(CaseRunEnd {
            report: usage_report(message),
            events: Vec::new(),
            calls: Vec::new(),
            elapsed: began.elapsed(),
            logged: None,
        }),
        Err(Refused::CannotRun(message)) => Err(message),
        Ok(end) => Ok(end),
    }
}

/// Why a case gave no run.
enum Refused {
    /// What `promptforge run` reports as a usage error.
    Usage(String),
    /// The case itself could not be set up.
    CannotRun(String),
}

/// The report `run --json` prints for a usage error.
fn usage_report(message: String) -> RunReport {
    RunReport {
        outcome: pf_host::report::ReportOutcome::Failed {
            error: pf_host::report::ReportError {
                kind: "Usage".to_string(),
                phase: None,
                message,
                line: None,
                column: None,
            },
        },
        seed: None,
        execution: None,
        store: None,
        output: None,
        usage: None,
    }
}

async fn run_checked(mut case: CaseRun<'_>) -> Result<CaseRunEnd, Refused> {
    let mut host = std::mem::take(&mut case.host);
    if let Some(extra) = &case.host_extra {
        let extra: Table =
            toml::from_str(extra).map_err(|e| Refused::Usage(format!("host file: {e}")))?;
        merge(&mut host, extra).map_err(Refused::Usage)?;
    }
    let file: HostFile = Value::Table(host)
        .try_into()
        .map_err(|e| Refused::Usage(format!("host file: {e}")))?;
    let config = HostConfig::from_file(&file, case.host_dir).map_err(Refused::Usage)?;
    let mut settings = RunSettings::with_host(None, Arc::new(config), &SettingsFlags::default())
        .map_err(Refused::Usage)?;
    settings.cache = case.cache.clone();
    run_session(&case, settings)
        .await
        .map_err(Refused::CannotRun)?
        .map_err(Refused::Usage)
}

/// The run itself: `Err` the case cannot run, `Ok(Err)` a usage error.
async fn run_session(
    case: &CaseRun<'_>,
    settings: RunSettings,
) -> Result<Result<CaseRunEnd, String>, String> {
    let (prompt_file, seed, store) = (case.prompt_file, case.seed, case.store);
    let case_start = case.start;
    let start =
        time::OffsetDateTime::parse(case_start, &time::format_description::well_known::Rfc3339)
            .map_err(|e| format!("start {case_start:?} is not an RFC 3339 instant: {e}"))?;
    let start_ms = (start.unix_timestamp_nanos() / 1_000_000) as i64;
    let source = pf_host::prompt_files::read_prompt(prompt_file)?;
    let collector = Arc::new(Collector::default());
    let began = Instant::now();
    let session = RunSession::begin(RunPlan {
        file: prompt_file.to_path_buf(),
        source,
        parsed: None,
        // As a child with no stdin read ARGS `-`: empty.
        args: PlanArgs::Exact(case.args.clone().filter(|a| a != "-").unwrap_or_default()),
        seed,
        start_ms,
        settings,
        store_dir: Some(store.to_path_buf()),
        no_log: !case.log,
        capture: false,
        quiet: true,
        replay_of: None,
        resumed_from: None,
        batch: case.batch.clone(),
        input_index: None,
        replay: None,
        cancel: case.cancel.clone(),
        watchers: vec![Arc::clone(&collector) as Arc<dyn RunObserver>],
        input_broker: Some(Arc::new(NoOperator)),
        after_engine: None,
    });
    let finished = match session {
        Ok(session) => session.run().await,
        Err(e) => Err(e),
    };
    let finished = match finished {
        Ok(finished) => finished,
        Err(e) => return Ok(Err(e.0)),
    };
    let elapsed = began.elapsed();
    let heard = std::mem::take(
        &mut *collector
            .heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    Ok(Ok(CaseRunEnd {
        report: finished.report.clone(),
        events: heard.events,
        calls: heard.calls,
        elapsed,
        logged: case.log.then_some(finished),
    }))
}

/// What a case's run reported, in order.
#[derive(Default)]
struct Heard {
    events: Vec<RunEvent>,
    calls: Vec<CallMade>,
}

/// Collects a run's events and tool calls for the assertions: each call the
/// model asked for (its `assistant_tool_calls` event, with arguments) and
/// each `tools.call` a script made (a dispatched call without a model call id).
#[derive(Default)]
pub struct Collector {
    heard: Mutex<Heard>,
}

impl RunObserver for Collector {
    fn event(&self, _execution: &str, event: &RunEvent) {
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        if let Event::AssistantToolCalls(batch) = &event.event {
            for call in &batch.calls {
                heard.calls.push(CallMade {
                    alias: call.name.clone(),
                    arguments: Some(call.arguments.clone()),
                });
            }
        }
        heard.events.push(event.clone());
    }

    fn tool_call(&self, _execution: &str, call: &ToolCallNotice<'_>) {
        if call.call_id.is_none() {
            let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
            heard.calls.push(CallMade {
                alias: call.alias.to_string(),
                arguments: Some(call.arguments.clone()),
            });
        }
    }
}

/// No operator: `input.ask` gets no answer, as from a closed stdin.
struct NoOperator;

#[async_trait]
impl InputBroker for NoOperator {
    async fn ask(
        &self,
        _question: &str,
        _work: &WorkId,
        _cancel: CancellationToken,
    ) -> Result<Option<String>, String> {
        Ok(None)
    }
}

/// `extra` (a case's own host-file text) merged into `host`: tables merge,
/// a key given twice is an error, as it is in one TOML file.
pub fn merge(host: &mut Table, extra: Table) -> Result<(), String> {
    for (key, value) in extra {
        match (host.get_mut(&key), value) {
            (Some(Value::Table(mine)), Value::Table(theirs)) => merge(mine, theirs)?,
            (Some(_), _) => return Err(format!("host file: `{key}` is given twice")),
            (None, value) => {
                host.insert(key, value);
            }
        }
    }
    Ok(())
}

/// A string value.
pub fn string(text: impl Into<String>) -> Value {
    Value::String(text.into())
}

/// A path as a string value.
pub fn path(path: &Path) -> Value {
    Value::String(path.to_string_lossy().into_owned())
}

/// Where a run's recorded model requests go in its scratch folder.
pub fn record_path(work: &Path) -> PathBuf {
    work.join("requests.jsonl")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_come_from_model_batches_and_script_notices() {
        let collector = Collector::default();
        let batch = pf_engine::event::AssistantToolCalls {
            turn: 1,
            model: "m".into(),
            calls: vec![pf_engine::event::RequestedCall {
                id: "call_1".into(),
                name: "save".into(),
                arguments: json!({"t": 1}),
            }],
        };
        collector.event(
            "x",
            &RunEvent {
                event: Event::AssistantToolCalls(batch),
                section: "Ask".into(),
                provenance: pf_engine::Provenance {
                    task: "0".into(),
                    seq: 3,
                },
            },
        );
        let (model_args, script_args) = (json!({"t": 1}), json!({"url": "u"}));
        let notice = |alias, arguments, call_id| ToolCallNotice {
            task: "0",
            section: "Ask",
            alias,
            arguments,
            call_id,
        };
        collector.tool_call("x", &notice("save", &model_args, Some("call_1")));
        collector.tool_call("x", &notice("fetch", &script_args, None));
        let heard = collector.heard.lock().unwrap();
        assert_eq!(
            heard.calls,
            vec![
                CallMade {
                    alias: "save".into(),
                    arguments: Some(json!({"t": 1}))
                },
                CallMade {
                    alias: "fetch".into(),
                    arguments: Some(json!({"url": "u"}))
                },
            ]
        );
        assert_eq!(heard.events.len(), 1);
        assert_eq!(
            heard.events[0].kind(),
            pf_engine::EventKind::AssistantToolCalls
        );
        assert_eq!(heard.events[0].provenance.seq, 3);
    }

    #[test]
    fn a_case_host_merges_tables_and_refuses_a_key_twice() {
        let mut host: Table =
            toml::from_str("[model]\nmodel = \"m\"\n[plugins.a]\ntrusted = true\n").unwrap();
        merge(
            &mut host,
            toml::from_str("[plugins.b]\ntrusted = false\n[web]\nallow_loopback = true\n").unwrap(),
        )
        .unwrap();
        assert!(host["plugins"].get("a").is_some() && host["plugins"].get("b").is_some());
        let twice = merge(
            &mut host,
            toml::from_str("[model]\nmodel = \"n\"\n").unwrap(),
        );
        assert_eq!(twice, Err("host file: `model` is given twice".to_string()));
    }
}
