//! Store claims across live chains (guide ch. 09 "Sharing the store across calls
//! and tasks"). A run has one live chain at a time today, so these tests start a
//! run beside a simulated second live chain through the test-only
//! `pf_engine::testing::run_beside_live_chain`, which holds store claims for the
//! whole run under `ExecId(0.9)`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pf_engine::testing::{run_beside_live_chain, ClaimKind, ForeignClaim};
use pf_engine::{Outcome, RunError, RunErrorKind, RunSetup};
use pf_harness::{CancellationToken, Harness, ModelInfo, ModelProvider, ThinkingSupport};
use pf_models::ScriptProvider;
use serde_json::json;

const OTHER: &str = "0.9";

fn prompt(body: &str) -> Arc<pf_syntax::Prompt> {
    let text = format!(
        "---\nname: t\ndescription: test\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# Claims\n\n{body}"
    );
    match pf_syntax::parse(text.as_bytes()) {
        Ok(p) => Arc::new(p),
        Err(e) => panic!("test prompt must parse: {e:?}"),
    }
}

fn held(path: &str, kind: ClaimKind) -> ForeignClaim {
    ForeignClaim {
        chain_id: OTHER.to_string(),
        path: path.to_string(),
        kind,
    }
}

fn model(replies: serde_json::Value) -> Arc<dyn ModelProvider> {
    let info = ModelInfo {
        id: "scripted".into(),
        context: 50_000,
        thinking: ThinkingSupport::Never,
        description: "Scripted".into(),
    };
    match ScriptProvider::from_json(&replies.to_string(), info) {
        Ok(p) => Arc::new(p),
        Err(e) => panic!("test replies must load: {e}"),
    }
}

/// Run `body` in `store` beside a live chain holding `claims`.
fn run_in(
    store: &Path,
    body: &str,
    claims: Vec<ForeignClaim>,
    replies: serde_json::Value,
    cancel: CancellationToken,
) -> Outcome {
    let setup = RunSetup {
        seed: 5,
        start_ms: 0,
        args: String::new(),
        store_dir: store.to_path_buf(),
        harness: Harness::new(),
        model: Some(model(replies)),
        catalog: Vec::new(),
        cancel,
        ui: None,
        observer: None,
        capture: false,
        limits: Default::default(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    rt.block_on(run_beside_live_chain(prompt(body), setup, claims))
        .outcome
}

fn store_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap_or_else(|e| panic!("seed {name}: {e}"));
    }
    dir
}

fn run(store: &Path, body: &str, claims: Vec<ForeignClaim>) -> Outcome {
    run_in(store, body, claims, json!([]), CancellationToken::new())
}

fn determinism(message: &str) -> Outcome {
    Outcome::Failed(RunError::new(RunErrorKind::Determinism, message))
}

fn contents(store: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(store.join(name)).ok()
}

const WRITE_VS_WRITE: &str = "store determinism violation: write on /_promptforge/store/shared.md by ExecId(0) conflicts with a write claim by ExecId(0.9)";

#[test]
fn a_conflicting_write_ends_the_run_even_inside_pcall() {
    let store = store_with(&[("shared.md", "theirs")]);
    let body = "## Main\n\n```lua\nlocal ok, err = pcall(store.write, 'shared.md', 'mine')\nstore.write('after.txt', 'the block went on')\nreturn 'caught: ' .. tostring(err)\n```\n";
    let outcome = run(
        store.path(),
        body,
        vec![held("shared.md", ClaimKind::Write)],
    );
    assert_eq!(outcome, determinism(WRITE_VS_WRITE));
    assert_eq!(
        contents(store.path(), "shared.md").as_deref(),
        Some("theirs")
    );
    assert_eq!(contents(store.path(), "after.txt"), None);
}

#[test]
fn an_xpcall_handler_cannot_keep_the_block_going() {
    let store = store_with(&[("shared.md", "theirs")]);
    let body = "## Main\n\n```lua\nxpcall(store.append, function(e)\n  store.write('handler.txt', 'ran')\n  return e\nend, 'shared.md', 'mine')\nreturn 'went on'\n```\n\n## Next\n\n```lua\nstore.write('next.txt', 'ran')\n```\n";
    let outcome = run(store.path(), body, vec![held("shared.md", ClaimKind::Read)]);
    assert_eq!(
        outcome,
        determinism("store determinism violation: write on /_promptforge/store/shared.md by ExecId(0) conflicts with a read claim by ExecId(0.9)")
    );
    assert_eq!(
        contents(store.path(), "shared.md").as_deref(),
        Some("theirs")
    );
    assert_eq!(contents(store.path(), "handler.txt"), None);
    assert_eq!(contents(store.path(), "next.txt"), None);
}

#[test]
fn a_busy_loop_after_a_caught_conflict_does_not_run_on() {
    let store = store_with(&[]);
    let body = "## Main\n\n```lua\npcall(store.delete, 'shared.md')\nwhile true do pcall(function() while true do end end) end\n```\n";
    let outcome = run(
        store.path(),
        body,
        vec![held("shared.md", ClaimKind::Write)],
    );
    assert_eq!(
        outcome,
        determinism("store determinism violation: write on /_promptforge/store/shared.md by ExecId(0) conflicts with a write claim by ExecId(0.9)")
    );
}

#[test]
fn every_writer_and_reader_takes_its_claim() {
    let writer = "store determinism violation: write on /_promptforge/store/shared.md by ExecId(0) conflicts with a write claim by ExecId(0.9)";
    let reader = "store determinism violation: read on /_promptforge/store/shared.md by ExecId(0) conflicts with a write claim by ExecId(0.9)";
    let cases = [
        ("store.write('shared.md', 'x')", writer),
        ("store.append('shared.md', 'x')", writer),
        ("store.str_replace('shared.md', 'theirs', 'x')", writer),
        ("store.delete('shared.md')", writer),
        ("store.read('shared.md')", reader),
        ("store.read('shared.md', 1, 1)", reader),
        ("store.read_numbered('shared.md')", reader),
        ("store.exists('shared.md')", reader),
        ("store.glob('*.md')", reader),
    ];
    for (call, message) in cases {
        let store = store_with(&[("shared.md", "theirs")]);
        let body = format!(
            "## Main\n\n```lua\npcall(function() return {call} end)\nreturn 'went on'\n```\n"
        );
        let outcome = run(
            store.path(),
            &body,
            vec![held("shared.md", ClaimKind::Write)],
        );
        assert_eq!(outcome, determinism(message), "{call}");
        assert_eq!(
            contents(store.path(), "shared.md").as_deref(),
            Some("theirs"),
            "{call}"
        );
    }
}

#[test]
fn a_read_beside_another_chains_read_does_not_conflict() {
    let store = store_with(&[("notes.md", "agreed"), ("other.md", "x")]);
    let body = "## Main\n\n```lua\nlocal listed = table.concat(store.glob('*.md'), ',')\nreturn store.read('notes.md') .. ' ' .. store.read_numbered('notes.md') .. ' ' .. tostring(store.exists('notes.md')) .. ' ' .. listed\n```\n";
    let outcome = run(store.path(), body, vec![held("notes.md", ClaimKind::Read)]);
    assert_eq!(
        outcome,
        Outcome::Completed("agreed 1| agreed true notes.md,other.md".into())
    );
}

#[test]
fn a_glob_that_matches_nothing_claimed_does_not_conflict() {
    let store = store_with(&[("arm-1.md", "alpha"), ("busy.txt", "x")]);
    let body = "## Main\n\n```lua\nreturn table.concat(store.glob('arm-*.md'), ',')\n```\n";
    let outcome = run(
        store.path(),
        body,
        vec![
            held("busy.txt", ClaimKind::Write),
            held("arm-2.md", ClaimKind::Write),
        ],
    );
    assert_eq!(outcome, Outcome::Completed("arm-1.md".into()));
}

#[test]
fn an_invalid_path_fails_with_its_own_message_not_a_conflict() {
    let store = store_with(&[]);
    let body = "## Main\n\n```lua\nlocal ok, err = pcall(store.write, '/shared.md', 'x')\nreturn err.message\n```\n";
    let outcome = run(
        store.path(),
        body,
        vec![held("/shared.md", ClaimKind::Write)],
    );
    assert_eq!(
        outcome,
        Outcome::Completed("invalid path \"/shared.md\": path is absolute".into())
    );
}

#[test]
fn a_conflict_while_the_shared_library_loads_raises_at_the_call() {
    let store = store_with(&[("shared.md", "theirs")]);
    let body = "```lua shared\nlocal ok, err = pcall(store.write, 'shared.md', 'mine')\nRACE = err.kind .. ': ' .. err.message\nlocal ok2, err2 = pcall(store.glob, '*.md')\nGLOB_RACE = err2.message\n```\n\n## Main\n\n```lua\nreturn RACE .. ' | ' .. GLOB_RACE\n```\n";
    let outcome = run(
        store.path(),
        body,
        vec![held("shared.md", ClaimKind::Write)],
    );
    assert_eq!(
        outcome,
        Outcome::Completed(
            "lua: write-write race on shared.md: another live identity holds a claim on it | write-write race on shared.md: another live identity holds a claim on it"
                .into()
        )
    );
    assert_eq!(
        contents(store.path(), "shared.md").as_deref(),
        Some("theirs")
    );
}

#[test]
fn an_uncaught_conflict_in_the_shared_library_stays_lua() {
    let store = store_with(&[]);
    let body = "```lua shared\nstore.append('shared.md', 'mine')\n```\n\n## Main\n\n```lua\nreturn 'unreached'\n```\n";
    let outcome = run(store.path(), body, vec![held("shared.md", ClaimKind::Read)]);
    assert_eq!(
        outcome,
        Outcome::Failed(RunError::new(
            RunErrorKind::Lua,
            "prompt shared library:12: write-write race on shared.md: another live identity holds a claim on it"
        ))
    );
    assert_eq!(contents(store.path(), "shared.md"), None);
}

#[test]
fn a_conflict_in_the_h1_pass_is_determinism_under_the_passs_identity() {
    let store = store_with(&[]);
    let body = "```lua\nlocal ok = pcall(store.write, 'shared.md', 'setup')\n```\n\n## Main\n\n```lua\nreturn 'unreached'\n```\n";
    let outcome = run(store.path(), body, vec![held("shared.md", ClaimKind::Read)]);
    assert_eq!(
        outcome,
        determinism("store determinism violation: write on /_promptforge/store/shared.md by ExecId(h1) conflicts with a read claim by ExecId(0.9)")
    );
}

#[test]
fn the_walks_own_repeated_use_of_a_path_never_conflicts() {
    let store = store_with(&[]);
    let body = "## One\n\n```lua\nstore.write('log.md', 'a')\nstore.append('log.md', 'b')\nlocal before = store.read('log.md')\nstore.str_replace('log.md', 'ab', 'c')\nstore.write('log.md', before .. store.read('log.md'))\n```\n\n## Two\n\n```lua\nstore.append('log.md', '-' .. table.concat(store.glob('*.md'), ','))\nstore.write('tmp.md', 'x')\nstore.delete('tmp.md')\nreturn store.read_numbered('log.md') .. ' ' .. tostring(store.exists('tmp.md'))\n```\n";
    let outcome = run(
        store.path(),
        body,
        vec![held("elsewhere.md", ClaimKind::Write)],
    );
    assert_eq!(outcome, Outcome::Completed("1| abc-log.md false".into()));
}

#[test]
fn a_called_chain_writes_its_callers_paths_without_conflict() {
    let store = store_with(&[]);
    let body = "## Main\n\n```lua\nstore.write('findings.md', 'caller;')\ncall('## Gather')\nstore.append('findings.md', 'caller again')\nreturn store.read('findings.md')\n```\n\n## Gather\n\n```lua\nstore.append('findings.md', store.read('findings.md') .. 'callee;')\nstore.write('findings.md', store.read('findings.md'))\n```\n";
    let outcome = run(store.path(), body, vec![]);
    assert_eq!(
        outcome,
        Outcome::Completed("caller;caller;callee;caller again".into())
    );
}

#[test]
fn a_called_chain_claims_as_its_caller_and_its_conflict_ends_the_run() {
    let store = store_with(&[]);
    let body = "## Main\n\n```lua\nlocal ok, err = pcall(call, '## Gather')\nreturn 'caught: ' .. tostring(err)\n```\n\n## Gather\n\n```lua\nstore.write('shared.md', 'callee')\n```\n";
    let outcome = run(
        store.path(),
        body,
        vec![held("shared.md", ClaimKind::Write)],
    );
    assert_eq!(outcome, determinism(WRITE_VS_WRITE));
    assert_eq!(contents(store.path(), "shared.md"), None);
}

#[test]
fn a_conflict_in_a_local_tool_handler_ends_the_run() {
    let store = store_with(&[]);
    let body = "## Ask\n\n```lua\nmodels.use('w')\ntools.add_local('save', 'Save a note', { text = 'string' }, function(p)\n  store.write('shared.md', p.text)\n  return 'saved'\nend)\nlocal msgs = messages.new():user('save hello')\nlocal ok = pcall(models.loop, msgs)\nstore.write('after.txt', 'went on')\nreturn msgs[#msgs].content\n```\n";
    let replies = json!([
        {"tool_calls": [{"name": "save", "arguments": {"text": "hello"}}]},
        "Saved."
    ]);
    let outcome = run_in(
        store.path(),
        body,
        vec![held("shared.md", ClaimKind::Write)],
        replies,
        CancellationToken::new(),
    );
    assert_eq!(outcome, determinism(WRITE_VS_WRITE));
    assert_eq!(contents(store.path(), "shared.md"), None);
    assert_eq!(contents(store.path(), "after.txt"), None);
}

#[test]
fn a_script_call_of_a_local_tool_cannot_swallow_a_conflict() {
    let store = store_with(&[]);
    let body = "## Main\n\n```lua\ntools.add_local('save', 'Save a note', { text = 'string' }, function(p)\n  store.write('shared.md', p.text)\n  return 'saved'\nend)\nlocal ok, err = pcall(tools.call, 'save', { text = 'hi' })\nreturn 'caught: ' .. tostring(err)\n```\n";
    let outcome = run(
        store.path(),
        body,
        vec![held("shared.md", ClaimKind::Write)],
    );
    assert_eq!(outcome, determinism(WRITE_VS_WRITE));
}

#[test]
fn a_host_cancel_that_came_first_wins() {
    let store = store_with(&[]);
    let cancel = CancellationToken::new();
    let body = "## Main\n\n```lua\nxpcall(function() while true do end end, function(e)\n  store.write('shared.md', 'mine')\n  return e\nend)\n```\n";
    let later = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        later.cancel();
    });
    let outcome = run_in(
        store.path(),
        body,
        vec![held("shared.md", ClaimKind::Write)],
        json!([]),
        cancel,
    );
    assert_eq!(outcome, Outcome::Cancelled);
    assert_eq!(contents(store.path(), "shared.md"), None);
}
