#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What the observer hears beside events: each tool call the Engine
//! dispatches, with its arguments (script and model calls alike), and the Lua
//! traceback of a block that failed on a raised error.

use std::sync::{Arc, Mutex};

use pf_engine::{LuaTraceback, Outcome, RunEvent, RunObserver, RunSetup, ToolCallNotice};
use pf_harness::{CancellationToken, Harness, ModelInfo, ThinkingSupport};
use pf_models::ScriptProvider;
use serde_json::{json, Value as Json};

/// A heard call: alias, arguments, the model's call id, section.
type HeardCall = (String, Json, Option<String>, String);

#[derive(Default)]
struct Heard {
    calls: Mutex<Vec<HeardCall>>,
    traces: Mutex<Vec<(String, String, String)>>,
}

impl RunObserver for Heard {
    fn event(&self, _execution: &str, _event: &RunEvent) {}
    fn tool_call(&self, _execution: &str, call: &ToolCallNotice<'_>) {
        self.calls.lock().unwrap().push((
            call.alias.to_string(),
            call.arguments.clone(),
            call.call_id.map(str::to_string),
            call.section.to_string(),
        ));
    }
    fn lua_traceback(&self, _execution: &str, trace: &LuaTraceback<'_>) {
        self.traces.lock().unwrap().push((
            trace.section.to_string(),
            trace.label.to_string(),
            trace.traceback.to_string(),
        ));
    }
}

fn run(body: &str, replies: Json) -> (Outcome, Arc<Heard>) {
    let text = format!(
        "---\nname: t\ndescription: test\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# Notices\n\n{body}"
    );
    let prompt = Arc::new(pf_syntax::parse(text.as_bytes()).expect("parses"));
    let info = ModelInfo {
        id: "scripted".into(),
        context: 50_000,
        thinking: ThinkingSupport::Never,
        description: "Scripted".into(),
    };
    let model = Arc::new(ScriptProvider::from_json(&replies.to_string(), info).expect("replies"));
    let heard = Arc::new(Heard::default());
    let store = tempfile::tempdir().expect("tempdir");
    let setup = RunSetup {
        seed: 3,
        start_ms: 0,
        args: String::new(),
        store_dir: store.path().to_path_buf(),
        harness: Harness::new(),
        model: Some(model),
        catalog: Vec::new(),
        cancel: CancellationToken::new(),
        ui: None,
        observer: Some(Arc::clone(&heard) as Arc<dyn RunObserver>),
        capture: false,
        limits: Default::default(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt.block_on(pf_engine::run(prompt, setup));
    (report.outcome, heard)
}

#[test]
fn every_dispatched_tool_call_is_heard_with_its_arguments() {
    let body = "## Add\n\n```lua\nmodels.use('w')\ntools.add_local('add', 'Add', { a = 'integer' }, function(p) return p.a end)\ntools.call('add', { a = 1 })\npcall(tools.call, 'nothing', { why = 'unbound' })\nlocal msgs = messages.new():user('go')\nmodels.loop(msgs)\nreturn msgs[#msgs].content\n```\n";
    let replies = json!([
        {"tool_calls": [{"name": "add", "arguments": {"a": 2}}]},
        "done"
    ]);
    let (outcome, heard) = run(body, replies);
    assert_eq!(outcome, Outcome::Completed("done".into()));
    let calls = heard.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(
        calls[0],
        ("add".into(), json!({"a": 1}), None, "Add".into())
    );
    assert_eq!(calls[1].0, "nothing");
    assert_eq!(calls[1].1, json!({"why": "unbound"}));
    assert_eq!(calls[2].0, "add");
    assert_eq!(calls[2].1, json!({"a": 2}));
    assert!(calls[2].2.is_some(), "a model call carries its call id");
    assert!(heard.traces.lock().unwrap().is_empty());
}

#[test]
fn a_failed_block_is_heard_with_its_traceback_at_absolute_lines() {
    let body = "## Main\n\n```lua\nlocal function inner()\n  error('boom')\nend\ninner()\n```\n";
    let (outcome, heard) = run(body, json!([]));
    assert!(matches!(outcome, Outcome::Failed(_)), "{outcome:?}");
    let traces = heard.traces.lock().unwrap().clone();
    assert_eq!(traces.len(), 1, "{traces:?}");
    let (section, label, traceback) = &traces[0];
    assert_eq!(section, "Main");
    assert_eq!(label, "section `Main` prologue");
    // The prompt's lines 15 (the raise) and 17 (the call), as the file counts them.
    assert!(traceback.starts_with("stack traceback:"), "{traceback}");
    assert!(
        traceback.contains("[string \"section `Main` prologue\"]:15: in"),
        "{traceback}"
    );
    assert!(
        traceback.contains("[string \"section `Main` prologue\"]:17: in main chunk"),
        "{traceback}"
    );
}

#[test]
fn an_error_caught_by_pcall_gives_no_traceback() {
    let body = "## Main\n\n```lua\npcall(error, 'caught')\nreturn 'fine'\n```\n";
    let (outcome, heard) = run(body, json!([]));
    assert_eq!(outcome, Outcome::Completed("fine".into()));
    assert!(heard.traces.lock().unwrap().is_empty());
}
