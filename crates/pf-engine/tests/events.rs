//! The run's event stream (guide ch. 11 "Turns and live output", ch. 16) and live
//! output, read back through `RunReport`, against the scripted model.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pf_engine::{EventKind, LiveText, Outcome, RunEvent, RunObserver, RunSetup};
use pf_harness::{
    ActivationContext, ActivePlugin, CancellationToken, ChatRequest, ChatResponse, Harness,
    ModelInfo, ModelProvider, OnText, Plugin, ProviderError, ThinkingSupport, ToolFailure,
    ToolSpec, WorkId,
};
use pf_models::ScriptProvider;
use serde_json::{json, Value as Json};

fn info() -> ModelInfo {
    ModelInfo {
        id: "scripted".into(),
        context: 50_000,
        thinking: ThinkingSupport::Never,
        description: "Scripted".into(),
    }
}

fn script(replies: Json) -> Arc<dyn ModelProvider> {
    match ScriptProvider::from_json(&replies.to_string(), info()) {
        Ok(p) => Arc::new(p),
        Err(e) => panic!("test replies must load: {e}"),
    }
}

fn prompt(frontmatter_extra: &str, body: &str) -> Arc<pf_syntax::Prompt> {
    let text = format!(
        "---\nname: t\ndescription: test\npromptforge: 0\n{frontmatter_extra}models:\n  w: {{}}\n---\n\n# Events\n\n{body}"
    );
    match pf_syntax::parse(text.as_bytes()) {
        Ok(p) => Arc::new(p),
        Err(e) => panic!("test prompt must parse: {e:?}"),
    }
}

/// A live output listener: true while it listens.
type LiveOutput = Box<dyn Fn(LiveText<'_>) -> bool + Send + Sync>;

/// An observer that keeps every event and passes live text to its listener.
struct Collect {
    events: Mutex<Vec<RunEvent>>,
    /// Every event again as the run kept it, shared (what the run log encodes).
    kept: Mutex<Vec<pf_engine::SharedEvent>>,
    live: Option<LiveOutput>,
}

impl RunObserver for Collect {
    fn event(&self, execution: &str, event: &RunEvent) {
        assert!(execution.starts_with("run-"), "{execution}");
        let mut all = self.events.lock().unwrap_or_else(|p| p.into_inner());
        all.push(event.clone());
    }
    fn wants_live_text(&self) -> bool {
        self.live.is_some()
    }
    fn live_text(&self, text: LiveText<'_>) -> bool {
        self.live.as_ref().is_some_and(|live| live(text))
    }
    fn wants_kept(&self) -> bool {
        true
    }
    fn kept(&self, _execution: &str, event: pf_engine::SharedEvent) {
        self.kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }
}

/// An event as heard, with its kind and fields as the run log writes them
/// (the tests read fields by name, as a prompt's `tasks.events` does).
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    run: RunEvent,
    kind: EventKind,
    fields: serde_json::Map<String, Json>,
}

impl Seen {
    fn of(run: &RunEvent) -> Seen {
        Seen {
            run: run.clone(),
            kind: run.kind(),
            fields: run.event.fields(),
        }
    }

    fn field(&self, name: &str) -> Option<&Json> {
        self.fields.get(name)
    }
}

impl std::ops::Deref for Seen {
    type Target = RunEvent;
    fn deref(&self) -> &RunEvent {
        &self.run
    }
}

/// Each kept event is the event heard just before it: the same coordinates,
/// and fields that serialize to the same bytes in the same key order.
fn assert_kept_as_heard(heard: &[Seen], kept: &[pf_engine::SharedEvent]) {
    assert_eq!(kept.len(), heard.len());
    for (kept, heard) in kept.iter().zip(heard) {
        assert_eq!(kept.to_event().unwrap(), heard.run);
        assert_eq!(kept.kind(), heard.kind);
        assert_eq!(kept.section(), heard.section);
        assert_eq!(kept.task(), heard.provenance.task);
        assert_eq!(kept.seq(), heard.provenance.seq);
        let fields = kept.fields_json().map(str::to_owned);
        let expected =
            (!heard.fields.is_empty()).then(|| serde_json::to_string(&heard.fields).unwrap());
        assert_eq!(fields, expected, "{:?}", heard.kind);
    }
}

/// What a run reported: its outcome and the events its observer heard, in order.
struct RunReport {
    outcome: Outcome,
    execution: String,
    checkpoints: Vec<pf_engine::Checkpoint>,
    /// The events of the work the prompt did (models, tools, store, log, input):
    /// every event but the parse, run, section and section VM boundaries.
    events: Vec<Seen>,
    /// Every event, boundaries included.
    all: Vec<Seen>,
}

/// The parse, run, section and section VM boundaries around the work.
fn is_lifecycle(kind: EventKind) -> bool {
    kind.as_str().starts_with("parse_")
        || kind.as_str().starts_with("run_")
        || kind.as_str().starts_with("section_")
        || kind.as_str().starts_with("lua_")
}

fn run_with(
    prompt: Arc<pf_syntax::Prompt>,
    model: Arc<dyn ModelProvider>,
    harness: Harness,
    live: Option<LiveOutput>,
) -> RunReport {
    let observer = Arc::new(Collect {
        events: Mutex::default(),
        kept: Mutex::default(),
        live,
    });
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let setup = RunSetup {
        seed: 3,
        start_ms: 0,
        args: String::new(),
        store_dir: store.path().to_path_buf(),
        harness,
        model: Some(model),
        catalog: Vec::new(),
        cancel: CancellationToken::new(),
        ui: None,
        observer: Some(Arc::clone(&observer) as Arc<dyn RunObserver>),
        capture: false,
        limits: Default::default(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let report = rt.block_on(pf_engine::run(prompt, setup));
    let all: Vec<Seen> = observer
        .events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(Seen::of)
        .collect();
    assert_kept_as_heard(
        &all,
        &observer.kept.lock().unwrap_or_else(|p| p.into_inner()),
    );
    RunReport {
        outcome: report.outcome,
        execution: report.execution,
        checkpoints: report.checkpoints,
        events: all
            .iter()
            .filter(|e| !is_lifecycle(e.kind))
            .cloned()
            .collect(),
        all,
    }
}

fn run(body: &str, replies: Json) -> RunReport {
    run_with(prompt("", body), script(replies), Harness::new(), None)
}

fn kinds(events: &[Seen]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.as_str()).collect()
}

fn of_kind(events: &[Seen], kind: EventKind) -> Vec<&Seen> {
    events.iter().filter(|e| e.kind == kind).collect()
}

const ONE_TOOL_ROUND: &str = "## Ask\n\n```lua\nmodels.use('w')\ntools.add_local('add', 'Add two integers', { a = 'integer', b = 'integer' }, function(p)\n  return p.a + p.b\nend)\nlocal msgs = messages.new():user('add 17 and 25')\nmodels.loop(msgs)\nreturn msgs[#msgs].content\n```\n";

fn one_tool_round_replies() -> Json {
    json!([
        {"tool_calls": [{"name": "add", "arguments": {"a": 17, "b": 25}}]},
        "The sum is 42."
    ])
}

#[test]
fn a_tool_round_then_a_reply_reports_the_guides_order() {
    let report = run(ONE_TOOL_ROUND, one_tool_round_replies());
    assert_eq!(report.outcome, Outcome::Completed("The sum is 42.".into()));
    let boundaries: Vec<&str> = report
        .events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::ModelTurnCompleted | EventKind::ToolCallSucceeded
            )
        })
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(
        boundaries,
        vec![
            "model_turn_completed",
            "tool_call_succeeded",
            "model_turn_completed"
        ]
    );
    assert_eq!(
        kinds(&report.events),
        vec![
            "tool_scope_validation_started",
            "tool_scope_validation_succeeded",
            "model_turn_completed",
            "assistant_tool_calls",
            "tool_call_succeeded",
            "tool_result",
            "tool_scope_validation_started",
            "tool_scope_validation_succeeded",
            "model_turn_completed",
            "assistant_reply",
        ]
    );
    // Every event is filed under the section that ran the loop, on the main walk.
    assert!(report
        .events
        .iter()
        .all(|e| e.section == "Ask" && e.provenance.task == "0"));
    // Each model call takes a number of its own, so the events skip 2 and 9.
    // Counted from the first one: the parse and section boundaries come before.
    let first = report.events.first().map_or(0, |e| e.provenance.seq);
    let seqs: Vec<u32> = report
        .events
        .iter()
        .map(|e| e.provenance.seq - first)
        .collect();
    assert_eq!(seqs, vec![0, 1, 3, 4, 5, 6, 7, 8, 10, 11]);
}

#[test]
fn round_events_carry_what_chapter_16_gives() {
    let report = run(ONE_TOOL_ROUND, one_tool_round_replies());
    let calls = of_kind(&report.events, EventKind::AssistantToolCalls);
    assert_eq!(
        calls.first().map(|e| Json::Object(e.fields.clone())),
        Some(json!({
            "turn": 1,
            "model": "scripted",
            "calls": [{"id": "call_1", "name": "add", "arguments": {"a": 17, "b": 25}}]
        }))
    );
    let results = of_kind(&report.events, EventKind::ToolResult);
    assert_eq!(
        results.first().map(|e| Json::Object(e.fields.clone())),
        Some(
            json!({"turn": 1, "tool_call_id": "call_1", "alias": "add", "content": "42", "trusted": true})
        )
    );
    let replies = of_kind(&report.events, EventKind::AssistantReply);
    let reply = replies.first().copied();
    assert_eq!(reply.and_then(|e| e.turn()), Some(2));
    assert_eq!(
        reply.and_then(|e| e.field("text")),
        Some(&json!("The sum is 42."))
    );
    assert_eq!(
        reply.and_then(|e| e.field("finish_reason")),
        Some(&json!("stop"))
    );
    assert_eq!(
        reply.and_then(|e| e.field("model")),
        Some(&json!("scripted"))
    );
    assert_eq!(reply.and_then(|e| e.field("origin")), Some(&json!("chat")));
    assert!(reply
        .and_then(|e| e.field("metrics"))
        .and_then(|m| m.pointer("/client/e2e_ms"))
        .is_some_and(Json::is_f64));
    // Boundary events hold the coordinates only.
    for e in of_kind(&report.events, EventKind::ModelTurnCompleted) {
        assert!(e.fields.is_empty(), "{e:?}");
    }
    // The run-log line of the reply event never holds the prompt's text.
    for e in &report.events {
        let line = e.to_json(&report.execution).to_string();
        assert!(!line.contains("add 17 and 25"), "{line}");
    }
}

#[test]
fn empty_replies_count_as_rounds_and_failed_rounds_do_not() {
    let body = "## Count\n\n```lua\nmodels.use('w')\nlocal ok1, e1 = pcall(models.infer, 'one')\nlocal ok2 = pcall(models.infer, 'two')\nlocal r = models.infer('three')\nlocal ok3 = pcall(models.infer, 'four')\nlocal msgs = messages.new():user('five')\nmodels.loop(msgs)\nreturn e1.kind .. '|' .. tostring(ok2) .. '|' .. r .. '|' .. tostring(ok3) .. '|' .. msgs[#msgs].content\n```\n";
    let report = run(
        body,
        json!([
            "   ",
            {"error": "backend down"},
            "third",
            {"context_overflow": true},
            "fifth"
        ]),
    );
    assert_eq!(
        report.outcome,
        Outcome::Completed("empty_model_reply|false|third|false|fifth".into())
    );
    assert_eq!(
        kinds(&report.events),
        vec![
            "model_turn_completed",
            "model_turn_failed",
            "model_turn_completed",
            "assistant_reply",
            "model_turn_failed",
            "tool_scope_validation_started",
            "tool_scope_validation_succeeded",
            "model_turn_completed",
            "assistant_reply",
        ]
    );
    let turns: Vec<Option<u32>> = of_kind(&report.events, EventKind::AssistantReply)
        .iter()
        .map(|e| e.turn())
        .collect();
    assert_eq!(turns, vec![Some(2), Some(3)]);
    let origins: Vec<Option<&Json>> = of_kind(&report.events, EventKind::AssistantReply)
        .iter()
        .map(|e| e.field("origin"))
        .collect();
    assert_eq!(origins, vec![Some(&json!("infer")), Some(&json!("chat"))]);
    // The empty reply's round carries its detail and finish reason.
    assert_eq!(
        report
            .events
            .first()
            .map(|e| Json::Object(e.fields.clone())),
        Some(json!({"detail": "empty model reply", "finish_reason": "stop"}))
    );
    // Failed rounds hold no message.
    for e in of_kind(&report.events, EventKind::ModelTurnFailed) {
        assert!(e.fields.is_empty(), "{e:?}");
    }
}

#[test]
fn a_truncated_reply_reports_truncation_between_completion_and_reply() {
    let body = "## Cut\n\n```lua\nmodels.use('w')\nlocal a = models.infer('long')\nlocal msgs = messages.new():user('long again')\nmodels.loop(msgs)\nreturn a .. '|' .. msgs[#msgs].content\n```\n";
    let report = run(
        body,
        json!([
            {"content": "cut", "finish": "length"},
            {"content": "cut again", "finish": "length"}
        ]),
    );
    assert_eq!(report.outcome, Outcome::Completed("cut|cut again".into()));
    assert_eq!(
        kinds(&report.events),
        vec![
            "model_turn_completed",
            "model_turn_truncated",
            "assistant_reply",
            "tool_scope_validation_started",
            "tool_scope_validation_succeeded",
            "model_turn_completed",
            "model_turn_truncated",
            "assistant_reply",
        ]
    );
}

#[test]
fn a_broken_list_is_a_failed_round_and_an_out_of_scope_call_a_failed_call() {
    let body = "## Bad\n\n```lua\nmodels.use('w')\nlocal bad = messages.new():user('x'):system('late')\nlocal ok, err = pcall(models.loop, bad)\nlocal msgs = messages.new():user('go')\nlocal ok2, err2 = pcall(models.loop, msgs)\nreturn tostring(err) .. '|' .. err2.kind .. '|' .. #msgs\n```\n";
    let report = run(
        body,
        json!([{"tool_calls": [{"name": "nowhere", "arguments": {}}]}]),
    );
    assert_eq!(
        report.outcome,
        Outcome::Completed(
            "messages[2] is a system message outside the leading system block|out_of_scope_tool|1"
                .into()
        )
    );
    assert_eq!(
        kinds(&report.events),
        vec![
            "model_turn_failed",
            "tool_scope_validation_started",
            "tool_scope_validation_succeeded",
            "model_turn_completed",
            "assistant_tool_calls",
            "tool_call_failed",
        ]
    );
}

#[test]
fn log_store_and_script_calls_report_under_their_section() {
    let body = "## Work\n\n```lua\nlog('loaded input')\nstore.write('notes.md', 'alpha')\npcall(store.read, 'missing.md')\nstore.exists('notes.md')\ntools.add_local('echo', 'Echo', { s = 'string' }, function(p) return p.s end)\nlocal out = tools.call('echo', { s = 'hi' })\nlocal ok = pcall(tools.call, 'nobody', {})\nreturn call('## Inner') .. out\n```\n\n## Inner\n\n```lua\nlog('inner ran')\nreturn 'hello '\n```\n";
    let report = run(body, json!([]));
    assert_eq!(report.outcome, Outcome::Completed("hello hi".into()));
    let lines: Vec<(String, &str)> = report
        .events
        .iter()
        .map(|e| (e.section.clone(), e.kind.as_str()))
        .collect();
    let expected: Vec<(String, &str)> = [
        ("Work", "lua"),
        ("Work", "store_write_succeeded"),
        ("Work", "store_read_failed"),
        ("Work", "tool_call_succeeded"),
        ("Work", "tool_result"),
        ("Work", "tool_call_failed"),
        ("Inner", "lua"),
    ]
    .iter()
    .map(|(s, k)| (s.to_string(), *k))
    .collect();
    assert_eq!(lines, expected);
    let lua: Vec<Option<&Json>> = of_kind(&report.events, EventKind::Lua)
        .iter()
        .map(|e| e.field("message"))
        .collect();
    assert_eq!(
        lua,
        vec![Some(&json!("loaded input")), Some(&json!("inner ran"))]
    );
    // Store events hold no path, content or error detail.
    assert!(report
        .events
        .iter()
        .filter(|e| e.kind.as_str().starts_with("store_"))
        .all(|e| e.fields.is_empty()));
    // A script call's result has an empty call id and the rounds completed so far.
    assert_eq!(
        of_kind(&report.events, EventKind::ToolResult)
            .first()
            .map(|e| Json::Object(e.fields.clone())),
        Some(
            json!({"turn": 0, "tool_call_id": "", "alias": "echo", "content": "hi", "trusted": true})
        )
    );
    // The checkpoints stay as they were.
    assert_eq!(report.checkpoints.len(), 2);
}

// ---------------------------------------------------------------------------
// Bound tools
// ---------------------------------------------------------------------------

/// A Plugin with one working and one failing tool, untrusted.
struct Wild;
struct WildActive;

#[async_trait]
impl Plugin for Wild {
    fn id(&self) -> &str {
        "acme/wild"
    }
    async fn activate(&self, _: ActivationContext) -> Result<Arc<dyn ActivePlugin>, String> {
        Ok(Arc::new(WildActive))
    }
}

#[async_trait]
impl ActivePlugin for WildActive {
    fn tools(&self) -> Vec<ToolSpec> {
        ["peek", "sour"]
            .iter()
            .map(|name| ToolSpec {
                path: format!("acme/wild/{name}"),
                description: format!("The {name} tool"),
                parameters: json!({"type": "object", "properties": {}}),
                structured: false,
                trusted: false,
            })
            .collect()
    }
    async fn call(
        &self,
        path: &str,
        _: Json,
        _: &WorkId,
        _: CancellationToken,
    ) -> Result<String, ToolFailure> {
        match path {
            "acme/wild/peek" => Ok("peeked".into()),
            _ => Err(ToolFailure("no luck".into())),
        }
    }
}

#[test]
fn bound_tool_calls_report_outcomes_and_wrapped_results() {
    let body = "## Loop\n\n```lua\nmodels.use('w')\ntools.add({ 'peek', 'sour' })\nlocal msgs = messages.new():user('use both')\nmodels.loop(msgs)\nreturn msgs[#msgs].content\n```\n";
    let mut harness = Harness::new();
    harness.register(Arc::new(Wild));
    let report = run_with(
        prompt(
            "plugins:\n  - acme/wild\ntools:\n  peek: acme/wild/peek\n  sour: acme/wild/sour\n",
            body,
        ),
        script(json!([
            {"tool_calls": [{"name": "peek", "arguments": {}}, {"name": "sour", "arguments": {}}]},
            "done"
        ])),
        harness,
        None,
    );
    assert_eq!(report.outcome, Outcome::Completed("done".into()));
    assert_eq!(
        kinds(&report.events),
        vec![
            "tool_scope_validation_started",
            "tool_scope_validation_succeeded",
            "model_turn_completed",
            "assistant_tool_calls",
            "tool_call_succeeded",
            "tool_result",
            "tool_call_failed",
            "tool_result",
            "tool_scope_validation_started",
            "tool_scope_validation_succeeded",
            "model_turn_completed",
            "assistant_reply",
        ]
    );
    let results = of_kind(&report.events, EventKind::ToolResult);
    let summary: Vec<(Option<&Json>, Option<&Json>, bool)> = results
        .iter()
        .map(|e| {
            let content = e.field("content").and_then(Json::as_str).unwrap_or("");
            (
                e.field("tool_call_id"),
                e.field("trusted"),
                content.contains("<untrusted_input_"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (Some(&json!("call_1")), Some(&json!(false)), true),
            (Some(&json!("call_2")), Some(&json!(false)), true),
        ]
    );
    let sour = results
        .get(1)
        .and_then(|e| e.field("content"))
        .and_then(Json::as_str)
        .unwrap_or("");
    assert!(sour.contains("no luck"), "{sour}");
    // Each bound call is host work and takes a number: the events skip past it.
    // Counted from the first one: the parse and section boundaries come before.
    let first = report.events.first().map_or(0, |e| e.provenance.seq);
    let seqs: Vec<u32> = report
        .events
        .iter()
        .map(|e| e.provenance.seq - first)
        .collect();
    assert_eq!(seqs, vec![0, 1, 3, 4, 6, 7, 9, 10, 11, 12, 14, 15]);
}

#[test]
fn the_observer_hears_the_whole_lifecycle_including_what_no_prompt_reads() {
    let body = "```lua shared\nfunction shout(text) return string.upper(text) end\n```\n\n## First\n\n```lua\nvar.word = shout('hello')\n```\n\n## Second\n\n```lua\nreturn var.word\n```\n";
    let report = run(body, json!([]));
    assert_eq!(report.outcome, Outcome::Completed("HELLO".into()));
    let lines: Vec<String> = report
        .all
        .iter()
        .map(|e| format!("{} {} {}", e.provenance.seq, e.section, e.kind))
        .collect();
    let section = |name: &str, from: u32| {
        [
            "section_started",
            "lua_shared_load_started",
            "lua_shared_load_succeeded",
            "lua_chunk_started",
            "lua_chunk_succeeded",
            "lua_teardown_started",
            "lua_teardown_succeeded",
            "section_finished",
        ]
        .iter()
        .zip(from..)
        .map(|(kind, seq)| format!("{seq} {name} {kind}"))
        .collect::<Vec<_>>()
    };
    let mut expected: Vec<String> = [
        "0 Prompt parse_started",
        "1 Events lua_compilation_started",
        "2 Events lua_compilation_succeeded",
        "3 First lua_compilation_started",
        "4 First lua_compilation_succeeded",
        "5 Second lua_compilation_started",
        "6 Second lua_compilation_succeeded",
        "7 Prompt parse_succeeded",
        "8 Events run_started",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    expected.extend(section("First", 9));
    expected.extend(section("Second", 17));
    expected.push("25 Events run_succeeded".into());
    assert_eq!(lines, expected);
    assert!(report.all.iter().all(|e| e.provenance.task == "0"));
}

#[test]
fn a_task_stranded_by_a_cancelled_run_is_abandoned_before_the_run_closes() {
    // The main walk waits on a model round that never answers while its task
    // waits on a second one; the run is cancelled from outside.
    let body = "## Main\n\n```lua\nlocal t = tasks.spawn('### Slow')\nmodels.use('w')\nmodels.infer('never')\n```\n\n### Slow\n\n```lua\nmodels.use('w')\nreturn models.infer('never')\n```\n";
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let observer = Arc::new(Collect {
        events: Mutex::default(),
        kept: Mutex::default(),
        live: None,
    });
    let cancel = CancellationToken::new();
    let setup = RunSetup {
        seed: 3,
        start_ms: 0,
        args: String::new(),
        store_dir: store.path().to_path_buf(),
        harness: Harness::new(),
        model: Some(Arc::new(Never)),
        catalog: Vec::new(),
        cancel: cancel.clone(),
        ui: None,
        observer: Some(Arc::clone(&observer) as Arc<dyn RunObserver>),
        capture: false,
        limits: Default::default(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let report = rt.block_on(async {
        let run = pf_engine::run(prompt("", body), setup);
        tokio::pin!(run);
        // Poll until both rounds are in flight, then cancel.
        loop {
            tokio::select! {
                r = &mut run => break r,
                _ = tokio::task::yield_now() => {
                    let waiting = observer
                        .events
                        .lock()
                        .map(|e| e.iter().filter(|e| e.kind() == EventKind::LuaChunkStarted).count())
                        .unwrap_or(0);
                    if waiting == 2 {
                        cancel.cancel();
                    }
                }
            }
        }
    });
    assert_eq!(report.outcome, Outcome::Cancelled);
    let all: Vec<Seen> = observer
        .events
        .lock()
        .map(|e| e.iter().map(Seen::of).collect())
        .unwrap_or_default();
    let tail: Vec<String> = all
        .iter()
        .rev()
        .take(2)
        .rev()
        .map(|e| {
            let reason = e.field("reason").and_then(Json::as_str).unwrap_or("");
            format!("{} {} {} {reason}", e.provenance.task, e.section, e.kind)
        })
        .collect();
    assert_eq!(
        tail,
        vec![
            "0.0 Slow task_abandoned run_terminated",
            "0 Events run_failed ",
        ]
    );
}

#[test]
fn capture_reports_the_bodies_ahead_of_each_round_only_when_switched_on() {
    let body = "## Ask\n\n```lua\nmodels.use('w')\nreturn models.infer('hello there')\n```\n";
    let replies = json!([{"content": "hi", "reasoning": "greet back"}]);
    let ran = |capture: bool| {
        let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let observer = Arc::new(Collect {
            events: Mutex::default(),
            kept: Mutex::default(),
            live: None,
        });
        let setup = RunSetup {
            seed: 3,
            start_ms: 0,
            args: String::new(),
            store_dir: store.path().to_path_buf(),
            harness: Harness::new(),
            model: Some(script(replies.clone())),
            catalog: Vec::new(),
            cancel: CancellationToken::new(),
            ui: None,
            observer: Some(Arc::clone(&observer) as Arc<dyn RunObserver>),
            capture,
            limits: Default::default(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        let outcome = rt.block_on(pf_engine::run(prompt("", body), setup)).outcome;
        assert_eq!(outcome, Outcome::Completed("hi".into()));
        let all: Vec<Seen> = observer
            .events
            .lock()
            .map(|e| e.iter().map(Seen::of).collect())
            .unwrap_or_default();
        all.into_iter()
            .filter(|e| !is_lifecycle(e.kind))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        kinds(&ran(false)),
        vec!["model_turn_completed", "thinking", "assistant_reply"]
    );
    let captured = ran(true);
    assert_eq!(
        kinds(&captured),
        vec![
            "request",
            "response",
            "model_turn_completed",
            "thinking",
            "assistant_reply"
        ]
    );
    let request = &captured[0];
    assert_eq!(request.turn(), Some(1));
    let sent = request.field("body").and_then(Json::as_str).unwrap_or("");
    assert!(sent.contains("hello there"), "{sent}");
    let response = &captured[1];
    assert_eq!(response.turn(), Some(1));
    assert_eq!(response.field("finish_reason"), Some(&json!("stop")));
    assert_eq!(
        response.field("reasoning_content"),
        Some(&json!("greet back"))
    );
    let received = response.field("body").and_then(Json::as_str).unwrap_or("");
    assert!(received.contains("greet back"), "{received}");
}

/// A model that never answers until cancelled.
struct Never;

#[async_trait]
impl ModelProvider for Never {
    fn info(&self) -> ModelInfo {
        info()
    }
    async fn complete(
        &self,
        _: ChatRequest,
        _: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        cancel.cancelled().await;
        Err(ProviderError::Cancelled)
    }
}

// ---------------------------------------------------------------------------
// Live output
// ---------------------------------------------------------------------------

type Heard = Arc<Mutex<Vec<(String, u32, String)>>>;

fn listener(heard: &Heard, listen_for: usize) -> LiveOutput {
    let heard = Arc::clone(heard);
    Box::new(move |t: LiveText<'_>| {
        let mut all = heard.lock().unwrap_or_else(|p| p.into_inner());
        all.push((t.section.to_string(), t.turn, t.text.to_string()));
        all.len() < listen_for
    })
}

#[test]
fn only_loop_rounds_reach_the_live_output() {
    let body = "## Talk\n\n```lua\nmodels.use('w')\nlocal a = models.infer('quiet')\nlocal msgs = messages.new():user('aloud')\nmodels.loop(msgs)\nreturn a .. '|' .. msgs[#msgs].content\n```\n";
    let heard: Heard = Arc::default();
    let report = run_with(
        prompt("", body),
        script(json!(["not streamed", "streamed reply"])),
        Harness::new(),
        Some(listener(&heard, usize::MAX)),
    );
    assert_eq!(
        report.outcome,
        Outcome::Completed("not streamed|streamed reply".into())
    );
    let heard = heard.lock().map(|h| h.clone()).unwrap_or_default();
    assert_eq!(heard, vec![("Talk".into(), 2, "streamed reply".into())]);
}

/// A provider that streams its reply in fixed fragments.
struct Drip {
    fragments: Vec<&'static str>,
}

#[async_trait]
impl ModelProvider for Drip {
    fn info(&self) -> ModelInfo {
        info()
    }
    async fn complete(
        &self,
        _: ChatRequest,
        _: &WorkId,
        _: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        Ok(ChatResponse {
            content: Some(self.fragments.concat()),
            finish_reason: Some("stop".into()),
            model: Some("drip".into()),
            ..Default::default()
        })
    }
    async fn complete_streaming(
        &self,
        _: ChatRequest,
        _: &WorkId,
        _: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        for fragment in &self.fragments {
            on_text(fragment);
        }
        // The whole content deliberately differs: the fragments are what counts.
        Ok(ChatResponse {
            content: Some("ignored".into()),
            finish_reason: Some("stop".into()),
            model: Some("drip".into()),
            ..Default::default()
        })
    }
}

const LOOP_ONCE: &str = "## Loop\n\n```lua\nmodels.use('w')\nlocal msgs = messages.new():user('talk')\nmodels.loop(msgs)\nreturn msgs[#msgs].content\n```\n";

#[test]
fn the_terminal_record_is_the_fragments_joined_and_a_host_may_stop_listening() {
    let heard: Heard = Arc::default();
    let report = run_with(
        prompt("", LOOP_ONCE),
        Arc::new(Drip {
            fragments: vec!["Hel", "lo, ", "world"],
        }),
        Harness::new(),
        Some(listener(&heard, 1)),
    );
    assert_eq!(report.outcome, Outcome::Completed("Hello, world".into()));
    let heard = heard.lock().map(|h| h.clone()).unwrap_or_default();
    assert_eq!(heard, vec![("Loop".into(), 1, "Hel".into())]);
    // The reply event holds the whole reply, never the fragments.
    let replies = of_kind(&report.events, EventKind::AssistantReply);
    assert_eq!(
        replies.first().and_then(|e| e.field("text")),
        Some(&json!("Hello, world"))
    );
    assert!(replies
        .first()
        .and_then(|e| e.field("metrics"))
        .and_then(|m| m.pointer("/client/mean_itl_ms"))
        .is_some());
}

#[test]
fn a_listener_that_panics_does_not_fail_the_round() {
    let live: LiveOutput = Box::new(|_| panic!("the terminal is gone"));
    let report = run_with(
        prompt("", LOOP_ONCE),
        Arc::new(Drip {
            fragments: vec!["still ", "here"],
        }),
        Harness::new(),
        Some(live),
    );
    assert_eq!(report.outcome, Outcome::Completed("still here".into()));
}
