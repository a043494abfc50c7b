//! The run log against real SQLite files: round trip, listing, resolving,
//! migration, and every kind of bad database.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pf_runlog::schema::SCHEMA_VERSION;
use pf_runlog::{
    ActivationRecord, EventRecord, ExchangeDraft, ExchangeHandle, Outcome, RunEnd, RunFilter,
    RunId, RunLog, RunLogError, RunStart, RunWriter, TokenUsage, WriterOptions,
};
use rusqlite::Connection;
use serde_json::json;

fn db_in(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("data").join("runs.db")
}

/// Log one finished run with `events` events and return its id.
fn log_run(log: &RunLog, execution: &str, events: u32, end: Option<RunEnd>) -> RunId {
    let writer = log.begin_with(start(execution), patient());
    for seq in 0..events {
        writer.event(event("0", seq, "lua"));
    }
    match end {
        Some(end) => assert_eq!(writer.finish(end), None),
        None => assert!(writer.flush()),
    }
    log.resolve(execution).expect("logged run resolves")
}

#[test]
fn everything_written_reads_back_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let mut run_start = start("run-00aa11bb22cc33dd");
    run_start.replay_of = Some("run-ffff000011112222".to_owned());
    run_start.resumed_from = Some("run-eeee000011112222".to_owned());
    let writer = log.begin_with(run_start.clone(), patient());

    let mut events = Vec::new();
    for seq in 0..300u32 {
        let task = if seq % 3 == 0 { "0.1" } else { "0" };
        let mut e = event(task, seq, "store_write_succeeded");
        if seq == 7 {
            e.fields = serde_json::Value::Null;
        }
        writer.event(e.clone());
        events.push(e);
    }
    let mut failed_exchange = exchange("0", 301);
    failed_exchange.response = None;
    failed_exchange.error = Some("HTTP 500: upstream".to_owned());
    failed_exchange.status = Some(500);
    failed_exchange.usage = None;
    failed_exchange.attempt = 2;
    let exchanges = vec![exchange("0", 300), failed_exchange];
    let mut failed_tool = tool_call("0.1", 303);
    failed_tool.output = None;
    failed_tool.failure = Some("timeout".to_owned());
    failed_tool.trusted = true;
    let tools = vec![tool_call("0", 302), failed_tool];
    let mut unanswered = answer("0", 305);
    unanswered.answer = None;
    let answers = vec![answer("0", 304), unanswered];
    for x in &exchanges {
        writer.exchange(x.clone());
    }
    for t in &tools {
        writer.tool_call(t.clone());
    }
    for a in &answers {
        writer.answer(a.clone());
    }
    let activations = vec![
        ActivationRecord {
            plugin: "acme/kit".to_owned(),
            tools: Some(json!([{"path": "acme/kit/echo", "description": "Echoes",
                "parameters": {"type": "object"}, "structured": false, "trusted": true}])),
            error: None,
        },
        ActivationRecord {
            plugin: "acme/gone".to_owned(),
            tools: None,
            error: Some("failed to initialize".to_owned()),
        },
    ];
    for a in &activations {
        writer.activation(a.clone());
    }
    let end = completed("the result");
    assert_eq!(writer.finish(end.clone()), None);

    let id = log.resolve("run-00aa11bb22cc33dd").unwrap();
    let run = log.run(id).unwrap().expect("run row");
    assert_eq!(run.start, run_start);
    assert_eq!(run.end, Some(end));
    assert_eq!(run.outcome_label(), "completed");
    // sha256 of the prompt text, computed independently.
    assert_eq!(run.prompt_sha256.len(), 64);
    assert!(run.finished_at_ms.is_some());
    assert_eq!(log.events(id).unwrap(), events);
    assert_eq!(log.exchanges(id).unwrap(), exchanges);
    assert_eq!(log.tool_calls(id).unwrap(), tools);
    assert_eq!(log.answers(id).unwrap(), answers);
    assert_eq!(log.activations(id).unwrap(), activations);

    let child: Vec<_> = events.iter().filter(|e| e.task == "0.1").cloned().collect();
    assert_eq!(log.events_of_task(id, "0.1", None).unwrap(), child);
    let after: Vec<_> = child.iter().filter(|e| e.seq > 150).cloned().collect();
    assert_eq!(log.events_of_task(id, "0.1", Some(150)).unwrap(), after);
    assert!(log.events_of_task(id, "0.9", None).unwrap().is_empty());
}

#[test]
fn prompt_hash_is_sha256_of_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let mut s = start("run-1");
    s.prompt_text = "abc".to_owned();
    let writer = log.begin_with(s, patient());
    writer.finish(completed("ok"));
    let run = log.run(log.resolve("last").unwrap()).unwrap().unwrap();
    assert_eq!(
        run.prompt_sha256,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn failed_and_cancelled_outcomes_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let failed = RunEnd {
        outcome: Outcome::Failed {
            kind: "model".to_owned(),
            message: "model call failed: HTTP 401".to_owned(),
        },
        duration_ms: 5,
        usage: TokenUsage::default(),
    };
    let cancelled = RunEnd {
        outcome: Outcome::Cancelled,
        duration_ms: 6,
        usage: TokenUsage::default(),
    };
    let a = log_run(&log, "run-a", 1, Some(failed.clone()));
    let b = log_run(&log, "run-b", 1, Some(cancelled.clone()));
    assert_eq!(log.run(a).unwrap().unwrap().end, Some(failed));
    assert_eq!(log.run(b).unwrap().unwrap().end, Some(cancelled));
    assert_eq!(log.run(RunId(999)).unwrap(), None);
}

#[test]
fn an_unfinished_run_reads_as_running() {
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let writer = log.begin_with(start("run-unfinished"), patient());
    writer.event(event("0", 0, "run_started"));
    assert!(writer.flush());
    let id = log.resolve("run-unfinished").unwrap();
    let run = log.run(id).unwrap().unwrap();
    assert_eq!(run.end, None);
    assert_eq!(run.outcome_label(), "running");
    let listed = log.list_runs(&RunFilter::default()).unwrap();
    assert_eq!(listed[0].outcome, "running");
    assert_eq!(listed[0].duration_ms, None);
    drop(writer);
}

#[test]
fn event_json_follows_the_guide_key_order() {
    let e = EventRecord {
        kind: "lua".to_owned(),
        section: "Inner".to_owned(),
        task: "0".to_owned(),
        seq: 4,
        fields: json!({ "message": "inner ran" }),
    };
    assert_eq!(
        serde_json::to_string(&e.to_json("run-1")).unwrap(),
        r#"{"kind":"lua","execution":"run-1","section":"Inner","provenance":{"task":"0","seq":4},"message":"inner ran"}"#
    );
}

#[test]
fn list_is_newest_first_and_filters() {
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let failed = RunEnd {
        outcome: Outcome::Failed {
            kind: "lua".to_owned(),
            message: "boom".to_owned(),
        },
        duration_ms: 1,
        usage: TokenUsage::default(),
    };
    log_run(&log, "run-1", 0, Some(completed("a")));
    log_run(&log, "run-2", 0, Some(failed));
    let mut other = start("run-3");
    other.prompt_path = "elsewhere/summarize.md".to_owned();
    let writer = log.begin_with(other, patient());
    writer.finish(completed("c"));
    log_run(&log, "run-4", 0, None);

    let all = log.list_runs(&RunFilter::default()).unwrap();
    let names: Vec<_> = all.iter().map(|r| r.execution.as_str()).collect();
    assert_eq!(names, ["run-4", "run-3", "run-2", "run-1"]);
    assert_eq!(all[1].usage.map(|u| u.total), Some(150));

    let two = log
        .list_runs(&RunFilter {
            limit: Some(2),
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(two.len(), 2);
    let by_prompt = log
        .list_runs(&RunFilter {
            prompt: Some("summ".to_owned()),
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(by_prompt.len(), 1);
    assert_eq!(by_prompt[0].execution, "run-3");
    for (outcome, expected) in [
        ("failed", "run-2"),
        ("running", "run-4"),
        ("completed", "run-3"),
    ] {
        let runs = log
            .list_runs(&RunFilter {
                outcome: Some(outcome.to_owned()),
                ..RunFilter::default()
            })
            .unwrap();
        assert_eq!(runs[0].execution, expected, "{outcome}");
        assert!(runs.iter().all(|r| r.outcome == outcome));
    }
}

#[test]
fn resolve_by_id_prefix_last_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let empty = log.resolve("last").unwrap_err();
    assert!(matches!(empty, RunLogError::Unknown { ref recent, .. } if recent.is_empty()));

    let first = log_run(&log, "run-abc123", 0, Some(completed("1")));
    let second = log_run(&log, "run-abd456", 0, Some(completed("2")));
    let third = log_run(&log, "run-f00000", 0, Some(completed("3")));

    assert_eq!(log.resolve("last").unwrap(), third);
    assert_eq!(log.resolve("run-abc123").unwrap(), first);
    assert_eq!(log.resolve("run-abc").unwrap(), first);
    assert_eq!(log.resolve("abd").unwrap(), second);
    assert_eq!(log.resolve("f").unwrap(), third);
    assert_eq!(log.resolve(&format!("#{}", first.0)).unwrap(), first);

    match log.resolve("run-ab").unwrap_err() {
        RunLogError::Ambiguous {
            matches,
            candidates,
            ..
        } => {
            assert_eq!(matches, 2);
            assert_eq!(candidates, ["run-abd456", "run-abc123"]);
        }
        other => panic!("expected ambiguous, got {other}"),
    }
    match log.resolve("run-zzz").unwrap_err() {
        RunLogError::Unknown { run, recent } => {
            assert_eq!(run, "run-zzz");
            assert_eq!(recent, ["run-f00000", "run-abd456", "run-abc123"]);
        }
        other => panic!("expected unknown, got {other}"),
    }
    for bad in ["", "#", "#x", "#99", "%", "run-ab%"] {
        assert!(
            matches!(log.resolve(bad), Err(RunLogError::Unknown { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn a_repeated_execution_resolves_to_its_newest_run() {
    // The same seed gives the same execution id; both runs are kept.
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let older = log_run(&log, "run-5eed", 1, Some(completed("old")));
    let newer = log_run(&log, "run-5eed", 2, Some(completed("new")));
    assert_ne!(older, newer);
    assert_eq!(log.resolve("run-5eed").unwrap(), newer);
    assert_eq!(log.resolve("5e").unwrap(), newer);
    assert_eq!(log.events(older).unwrap().len(), 1);
    assert_eq!(log.events(newer).unwrap().len(), 2);
    assert_eq!(log.list_runs(&RunFilter::default()).unwrap().len(), 2);
}

/// Version 1 of the schema, written out by hand (not taken from the crate)
/// so the test keeps checking what old databases really contain; the CLI's
/// migration test reads the same file.
const V1_BY_HAND: &str = include_str!("fixtures/version-1.sql");

#[test]
fn a_version_1_database_is_migrated_and_keeps_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch(V1_BY_HAND)
        .unwrap();

    let log = RunLog::open(&path).unwrap();
    let version: i64 = Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);

    let old = log.resolve("run-01d").unwrap();
    let run = log.run(old).unwrap().unwrap();
    assert_eq!(run.start.seed, u64::MAX);
    assert_eq!(run.start.args, json!({ "a": 1 }));
    assert_eq!(run.start.replay_of, None);
    assert_eq!(run.end.unwrap().usage.total, 3);
    let kinds: Vec<_> = log
        .events(old)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["run_started", "run_succeeded"]);
    assert!(log.exchanges(old).unwrap().is_empty());

    // New runs go in beside the old one, with the new tables.
    let writer = log.begin_with(start("run-new"), patient());
    writer.exchange(exchange("0", 1));
    assert_eq!(writer.finish(completed("new")), None);
    let new = log.resolve("last").unwrap();
    assert_eq!(log.exchanges(new).unwrap().len(), 1);
    assert_eq!(log.list_runs(&RunFilter::default()).unwrap().len(), 2);
    // Opening again is a no-op.
    drop(log);
    assert_eq!(
        RunLog::open(&path)
            .unwrap()
            .list_runs(&RunFilter::default())
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_newer_schema_is_refused_not_touched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE future (x); PRAGMA user_version = 99;")
        .unwrap();
    let err = RunLog::open(&path).unwrap_err();
    assert!(
        matches!(err, RunLogError::TooNew { found: 99, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("newer"), "{err}");

    let writer = RunWriter::begin_with(&path, start("run-x"), patient());
    let warning = writer.finish(completed("x")).expect("a warning");
    assert!(warning.contains("newer"), "{warning}");
}

#[test]
fn a_corrupt_file_is_a_clear_error_and_stays_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 13) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();

    let err = RunLog::open(&path).unwrap_err();
    assert!(matches!(err, RunLogError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("not a run log database"), "{err}");

    let writer = RunWriter::begin_with(&path, start("run-x"), patient());
    writer.event(event("0", 0, "run_started"));
    let warning = writer.finish(completed("x")).expect("a warning");
    assert!(warning.contains("not a run log database"), "{warning}");
    assert_eq!(std::fs::read(&path).unwrap(), garbage);
}

fn counting_options(count: &Arc<AtomicUsize>) -> WriterOptions {
    let count = Arc::clone(count);
    WriterOptions {
        on_warning: Some(Arc::new(move |_: &str| {
            count.fetch_add(1, Ordering::SeqCst);
        })),
        ..patient()
    }
}

/// Every location here is unusable even for root.
#[test]
fn an_unwritable_location_warns_once_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let a_directory = dir.path().join("a-directory");
    std::fs::create_dir(&a_directory).unwrap();
    for path in [file.join("runs.db"), a_directory] {
        assert!(RunLog::open(&path).is_err(), "{}", path.display());
        let count = Arc::new(AtomicUsize::new(0));
        let writer = RunWriter::begin_with(&path, start("run-x"), counting_options(&count));
        for seq in 0..10 {
            writer.event(event("0", seq, "lua"));
        }
        assert!(!writer.flush());
        writer.event(event("0", 11, "lua"));
        let warning = writer.finish(completed("x")).expect("a warning");
        assert!(warning.contains("cannot"), "{warning}");
        assert!(warning.contains(&path.display().to_string()), "{warning}");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}

/// Permission bits bind only an unprivileged user; as root this test checks
/// what it can (that writing works) and says so.
#[test]
#[cfg(unix)]
fn a_read_only_database_warns_and_the_run_goes_on() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let path = data.join("runs.db");
    log_run(&RunLog::open(&path).unwrap(), "run-before", 1, None);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o555)).unwrap();
    let privileged = std::fs::write(data.join("probe"), "x").is_ok();

    let count = Arc::new(AtomicUsize::new(0));
    let writer = RunWriter::begin_with(&path, start("run-ro"), counting_options(&count));
    writer.event(event("0", 0, "run_started"));
    let warning = writer.finish(completed("x"));
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    if privileged {
        eprintln!(
            "running as a privileged user: permission bits do not bind, checked writing only"
        );
        assert_eq!(warning, None);
    } else {
        let warning = warning.expect("a warning");
        assert!(warning.contains("run log"), "{warning}");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
    // What was logged before is still there.
    let log = RunLog::open(&path).unwrap();
    assert!(log.resolve("run-before").is_ok());
}

#[test]
fn a_locked_database_warns_once_and_drops_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();

    let count = Arc::new(AtomicUsize::new(0));
    let options = WriterOptions {
        busy_timeout: Duration::from_millis(20),
        busy_retries: 1,
        ..counting_options(&count)
    };
    let writer = log.begin_with(start("run-locked"), options);
    writer.event(event("0", 0, "run_started"));
    assert!(!writer.flush());
    writer.event(event("0", 1, "lua"));
    let warning = writer.finish(completed("x")).expect("a warning");
    assert!(warning.contains("locked"), "{warning}");
    assert_eq!(count.load(Ordering::SeqCst), 1);

    holder.execute_batch("COMMIT").unwrap();
    assert!(log.list_runs(&RunFilter::default()).unwrap().is_empty());
}

#[test]
fn finish_waits_a_bounded_time_for_a_stuck_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let options = WriterOptions {
        // The writer would wait far longer than finish does.
        busy_timeout: Duration::from_secs(3600),
        finish_wait: Duration::from_millis(50),
        ..WriterOptions::default()
    };
    let writer = log.begin_with(start("run-stuck"), options);
    writer.event(event("0", 0, "run_started"));
    let warning = writer.finish(completed("x")).expect("a warning");
    assert!(warning.contains("still writing"), "{warning}");
    holder.execute_batch("COMMIT").unwrap();
}

/// `len` letters that do not compress (xorshift from `seed`).
fn noise(len: usize, seed: u32) -> String {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(seed);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'a' + (state % 26) as u8)
        })
        .collect()
}

#[test]
fn a_full_database_warns_once_and_keeps_what_fit() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let options = WriterOptions {
        max_page_count: Some(64),
        ..counting_options(&count)
    };
    let writer = log.begin_with(start("run-full"), options);
    writer.event(event("0", 0, "run_started"));
    assert!(writer.flush());
    let mut seq = 1;
    for _ in 0..8 {
        for _ in 0..8 {
            let mut e = event("0", seq, "lua");
            // Pseudo-random, so the packed rows fill the pages too.
            e.fields = json!({ "message": noise(16 * 1024, seq) });
            writer.event(e);
            seq += 1;
        }
        writer.flush();
    }
    let warning = writer.finish(completed("x")).expect("a warning");
    assert!(warning.contains("full"), "{warning}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let id = log.resolve("run-full").unwrap();
    assert_eq!(log.events(id).unwrap()[0].kind, "run_started");
    assert_eq!(log.run(id).unwrap().unwrap().outcome_label(), "running");
}

/// A request body as a recorder would encode it: a Serialize value.
#[derive(serde::Serialize)]
struct Body {
    messages: Vec<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<serde_json::Value>,
    temperature: f64,
}

fn draft(
    task: &str,
    seq: u32,
    messages: Vec<serde_json::Value>,
    extends: Option<ExchangeHandle>,
) -> ExchangeDraft {
    ExchangeDraft {
        task: task.to_owned(),
        seq,
        section: "Loop".to_owned(),
        model: "small".to_owned(),
        attempt: 1,
        request_json: serde_json::to_string(&Body {
            messages,
            tools: Some(json!([{"name": "tick"}])),
            temperature: 0.5,
        })
        .unwrap(),
        extends,
        same_tools: false,
        response_json: Some(json!({"content": format!("reply {seq}")}).to_string()),
        error: None,
        status: None,
        started_ms: 7,
        duration_ms: 1,
        usage: None,
    }
}

/// The exchange work lines a database holds, in order, as JSON arrays.
fn stored_exchanges(path: &std::path::Path) -> Vec<Vec<serde_json::Value>> {
    let mut rows = RunLog::open(path).unwrap().stored_rows().unwrap();
    rows.sort_by_key(|row| (row.run, row.first_ord));
    rows.iter()
        .flat_map(|row| row.work.lines())
        .filter(|line| line.starts_with("[\"x\""))
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn said(n: usize) -> serde_json::Value {
    json!({"role": "user", "content": format!("message {n}")})
}

#[test]
fn a_request_stored_as_what_it_adds_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let writer = log.begin_with(start("run-de17a"), patient());
    // Task 0 grows one conversation over three rounds; task 0.1 interleaves
    // its own, and a base that was never logged leaves the added messages.
    let first = writer.exchange_draft(draft("0", 1, vec![said(0)], None));
    let other = writer.exchange_draft(draft("0.1", 1, vec![said(9)], None));
    let second = writer.exchange_draft(draft("0", 2, vec![said(1), said(2)], Some(first)));
    assert!(writer.flush());
    writer.exchange_draft(draft("0", 3, vec![said(3)], Some(second)));
    writer.exchange_draft(draft("0.1", 2, vec![said(10)], Some(other)));
    writer.exchange_draft(draft(
        "0.2",
        1,
        vec![said(20)],
        Some(ExchangeHandle::for_tests(99)),
    ));
    assert_eq!(writer.finish(completed("done")), None);

    let id = log.resolve("last").unwrap();
    let read = log.exchanges(id).unwrap();
    let requests: Vec<String> = read.iter().map(|x| x.request.to_string()).collect();
    let whole = |ns: &[usize]| {
        json!({"messages": ns.iter().map(|&n| said(n)).collect::<Vec<_>>(),
            "tools": [{"name": "tick"}], "temperature": 0.5})
        .to_string()
    };
    assert_eq!(
        requests,
        [
            whole(&[0]),
            whole(&[9]),
            whole(&[0, 1, 2]),
            whole(&[0, 1, 2, 3]),
            whole(&[9, 10]),
            whole(&[20]),
        ]
    );
    assert_eq!(read[3].response, Some(json!({"content": "reply 3"})));
    assert_eq!(read[3].seq, 3);
    // What is stored is only what each request adds (work lines since
    // schema 5: `extends` is the handle of the request continued, the
    // request is the line's next-to-last element).
    let stored: Vec<(String, Option<i64>)> = stored_exchanges(&db_in(&dir))
        .iter()
        .map(|line| (line[14].to_string(), line[7].as_i64()))
        .collect();
    assert!(stored[3].0.contains("message 3") && !stored[3].0.contains("message 2"));
    assert_eq!(stored[3].1, Some(2));
    assert_eq!(stored[0].1, None);
}

#[test]
fn a_continued_request_stored_without_its_unchanged_tools_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let writer = log.begin_with(start("run-5a7e"), patient());
    let first = writer.exchange_draft(draft("0", 1, vec![said(0)], None));
    let mut second = draft("0", 2, vec![said(1)], Some(first));
    second.request_json = json!({"messages": [said(1)], "temperature": 0.5}).to_string();
    second.same_tools = true;
    let second = writer.exchange_draft(second);
    // Tools of its own (here none): kept as they are.
    let mut third = draft("0", 3, vec![said(2)], Some(second));
    third.request_json = json!({"messages": [said(2)], "temperature": 0.5}).to_string();
    writer.exchange_draft(third);
    assert_eq!(writer.finish(completed("done")), None);

    let id = log.resolve("last").unwrap();
    let requests: Vec<String> = log
        .exchanges(id)
        .unwrap()
        .iter()
        .map(|x| x.request.to_string())
        .collect();
    let tools = json!([{"name": "tick"}]);
    assert_eq!(
        requests,
        [
            json!({"messages": [said(0)], "tools": tools, "temperature": 0.5}).to_string(),
            json!({"messages": [said(0), said(1)], "tools": tools, "temperature": 0.5}).to_string(),
            json!({"messages": [said(0), said(1), said(2)], "temperature": 0.5}).to_string(),
        ]
    );
}

/// Version 3 of the schema (the last before requests could be stored as
/// continuations), by hand, with one run and one whole exchange.
const V3_EXCHANGES_BY_HAND: &str = "
CREATE TABLE exchanges (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),
    task TEXT NOT NULL, seq INTEGER NOT NULL, section TEXT NOT NULL, model TEXT NOT NULL,
    attempt INTEGER NOT NULL, request_json TEXT NOT NULL, response_json TEXT, error TEXT,
    status INTEGER, started_ms INTEGER NOT NULL, duration_ms INTEGER NOT NULL,
    input_tokens INTEGER, output_tokens INTEGER, total_tokens INTEGER);
CREATE INDEX exchanges_by_work ON exchanges(run_id, task, seq);
CREATE TABLE tool_calls (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),
    task TEXT NOT NULL, seq INTEGER NOT NULL, section TEXT NOT NULL, alias TEXT NOT NULL,
    path TEXT NOT NULL, arguments_json TEXT NOT NULL, output TEXT, trusted INTEGER NOT NULL,
    failure TEXT);
CREATE INDEX tool_calls_by_work ON tool_calls(run_id, task, seq);
CREATE TABLE answers (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),
    task TEXT NOT NULL, seq INTEGER NOT NULL, section TEXT NOT NULL, question TEXT NOT NULL,
    answer TEXT);
CREATE INDEX answers_by_work ON answers(run_id, task, seq);
CREATE TABLE activations (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),
    plugin TEXT NOT NULL, tools_json TEXT, error TEXT);
CREATE INDEX activations_by_run ON activations(run_id);
ALTER TABLE runs ADD COLUMN replay_of TEXT;
ALTER TABLE runs ADD COLUMN resumed_from TEXT;
CREATE INDEX events_by_task ON events(run_id, task, seq);
INSERT INTO exchanges VALUES (1, 1, '0', 1, 'Old', 'm', 1,
    '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}', '{\"content\":\"yo\"}',
    NULL, NULL, 1704067200500, 20, 1, 2, 3);
PRAGMA user_version = 3;
";

#[test]
fn a_version_3_database_is_migrated_and_keeps_its_exchanges() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(V1_BY_HAND).unwrap();
    conn.execute_batch(V3_EXCHANGES_BY_HAND).unwrap();
    drop(conn);

    let log = RunLog::open(&path).unwrap();
    let version: i64 = Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let old = log.resolve("run-01d").unwrap();
    let exchanges = log.exchanges(old).unwrap();
    assert_eq!(exchanges.len(), 1);
    assert_eq!(
        exchanges[0].request,
        json!({"messages": [{"role": "user", "content": "hi"}]})
    );
    assert_eq!(exchanges[0].response, Some(json!({"content": "yo"})));
    assert_eq!(exchanges[0].usage.map(|u| u.total), Some(3));

    // A new run continues requests beside the old whole one.
    let writer = log.begin_with(start("run-new"), patient());
    let first = writer.exchange_draft(draft("0", 1, vec![said(0)], None));
    writer.exchange_draft(draft("0", 2, vec![said(1)], Some(first)));
    assert_eq!(writer.finish(completed("new")), None);
    let new = log.resolve("last").unwrap();
    let requests = log.exchanges(new).unwrap();
    assert_eq!(requests[1].request["messages"], json!([said(0), said(1)]));
    assert_eq!(log.exchanges(old).unwrap(), exchanges);
}

#[test]
fn a_deferred_finish_is_committed_once_its_tail_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    // Back to back on one database, as `promptforge mcp` runs them: each
    // writer hands its end to the database's thread and returns at once.
    let mut tails = Vec::new();
    for run in 0..20u32 {
        let writer = log.begin_with(start(&format!("run-deferred-{run:02}")), patient());
        for seq in 0..50 {
            writer.event(event("0", seq, "lua"));
        }
        writer.exchange(exchange("0", 50));
        tails.push(writer.finish_deferred(completed(&format!("r{run}"))));
    }
    for mut tail in tails {
        assert_eq!(tail.wait_committed(), None);
        assert_eq!(tail.wait(Duration::from_secs(120)), None);
    }
    for run in 0..20u32 {
        let id = log.resolve(&format!("run-deferred-{run:02}")).unwrap();
        let logged = log.run(id).unwrap().expect("run row");
        assert_eq!(logged.end, Some(completed(&format!("r{run}"))));
        assert_eq!(log.events(id).unwrap().len(), 50);
        assert_eq!(log.exchanges(id).unwrap().len(), 1);
    }
}

#[test]
fn deferred_finishes_are_all_committed_by_the_last_ones_wait() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    // Windows of an hour: the database's thread is not woken by a run's
    // end, so only a wait on a tail makes it (or the waiting thread) commit
    // before then, and that commit takes every run queued there.
    let options = WriterOptions {
        batch_window: Duration::from_secs(3600),
        batch_window_max: Duration::from_secs(3600),
        ..patient()
    };
    let mut last = None;
    for run in 0..8u32 {
        let writer = log.begin_with(start(&format!("run-woken-{run}")), options.clone());
        writer.event(event("0", 0, "lua"));
        writer.exchange(exchange("0", 1));
        // Only the last tail is waited on; the others are dropped.
        last = Some(writer.finish_deferred(completed(&format!("r{run}"))));
    }
    assert_eq!(last.unwrap().wait(Duration::from_secs(120)), None);
    for run in 0..8u32 {
        let execution = format!("run-woken-{run}");
        // Bounded far above the milliseconds it takes; an hour-long wait
        // for a window would fail it.
        let mut ended = None;
        for _ in 0..6000 {
            ended = log
                .resolve(&execution)
                .ok()
                .and_then(|id| log.run(id).ok().flatten())
                .and_then(|run| run.end);
            if ended.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(ended, Some(completed(&format!("r{run}"))), "{execution}");
        let id = log.resolve(&execution).unwrap();
        assert_eq!(log.exchanges(id).unwrap().len(), 1);
    }
}

#[test]
fn a_deferred_finish_on_a_stuck_database_warns_within_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let options = WriterOptions {
        busy_timeout: Duration::from_secs(3600),
        finish_wait: Duration::from_millis(50),
        ..counting_options(&count)
    };
    let writer = log.begin_with(start("run-stuck-deferred"), options);
    writer.event(event("0", 0, "run_started"));
    let mut tail = writer.finish_deferred(completed("x"));
    let warning = tail.wait_committed().expect("a warning");
    assert!(warning.contains("still writing"), "{warning}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    holder.execute_batch("COMMIT").unwrap();
}

/// A run with every kind of row: events, then host work alone (a row with
/// no events), then both, over three commits.
fn log_every_kind(log: &RunLog, execution: &str) -> RunId {
    let writer = log.begin_with(start(execution), patient());
    for seq in 0..40 {
        writer.event(event("0", seq, "store_write_succeeded"));
    }
    assert!(writer.flush());
    writer.exchange(exchange("0", 40));
    let first = writer.exchange_draft(draft("0", 41, vec![said(0)], None));
    writer.exchange_draft(draft("0", 42, vec![said(1)], Some(first)));
    writer.tool_call(tool_call("0.1", 43));
    assert!(writer.flush());
    writer.answer(answer("0", 44));
    writer.activation(ActivationRecord {
        plugin: "acme/kit".to_owned(),
        tools: Some(json!([{"path": "acme/kit/echo"}])),
        error: None,
    });
    writer.event(event("0.1", 45, "lua"));
    assert_eq!(writer.finish(completed("done")), None);
    log.resolve(execution).unwrap()
}

/// Everything `RunLog` reads back of a run.
fn read_back(log: &RunLog, id: RunId) -> serde_json::Value {
    json!({
        "run": format!("{:?}", log.run(id).unwrap()),
        "events": log.events(id).unwrap(),
        "of_task": log.events_of_task(id, "0.1", Some(10)).unwrap(),
        "exchanges": log.exchanges(id).unwrap(),
        "tool_calls": format!("{:?}", log.tool_calls(id).unwrap()),
        "answers": format!("{:?}", log.answers(id).unwrap()),
        "activations": format!("{:?}", log.activations(id).unwrap()),
    })
}

#[test]
fn rows_are_stored_packed_and_read_back_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    let id = log_every_kind(&log, "run-5ac6ed");
    assert_eq!(log.events(id).unwrap().len(), 41);
    assert_eq!(log.exchanges(id).unwrap().len(), 3);
    assert_eq!(log.tool_calls(id).unwrap(), [tool_call("0.1", 43)]);
    assert_eq!(log.answers(id).unwrap(), [answer("0", 44)]);
    let rows = log.stored_rows().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|row| row.packed));
    assert!(rows[1].lines.is_empty() && rows[1].work.lines().count() == 4);
    // In the file, the text columns are empty; only the packed bytes hold it.
    let plain: i64 = Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM event_batches WHERE lines != '' OR work IS NOT NULL
                 OR packed IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(plain, 0);
}

/// Turn a database this build wrote into what the version 5 writer wrote
/// for the same rows: the text in `lines` and `work` (NULL when the commit
/// had no work), no `packed` column, `user_version` 5.
fn as_version_5(path: &std::path::Path, rows: &[pf_runlog::StoredRow]) {
    let conn = Connection::open(path).unwrap();
    let ids: Vec<i64> = conn
        .prepare("SELECT id FROM event_batches ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(ids.len(), rows.len());
    for (id, row) in ids.iter().zip(rows) {
        let work = (!row.work.is_empty()).then_some(row.work.as_str());
        conn.execute(
            "UPDATE event_batches SET lines = ?2, work = ?3 WHERE id = ?1",
            rusqlite::params![id, row.lines, work],
        )
        .unwrap();
    }
    conn.execute_batch(WITHOUT_SEARCH_INDEX).unwrap();
    conn.execute_batch(
        "ALTER TABLE event_batches DROP COLUMN packed;
         DROP INDEX runs_by_batch; ALTER TABLE runs DROP COLUMN batch;
         PRAGMA user_version = 5;",
    )
    .unwrap();
}

#[test]
fn a_version_6_database_gains_batch_ids_and_its_runs_read_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let (old, before) = {
        let log = RunLog::open(&path).unwrap();
        let old = log_every_kind(&log, "run-0ld6");
        let before = read_back(&log, old);
        drop(log);
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(WITHOUT_SEARCH_INDEX).unwrap();
        conn.execute_batch(
            "DROP INDEX runs_by_batch; ALTER TABLE runs DROP COLUMN batch;
             PRAGMA user_version = 6;",
        )
        .unwrap();
        (old, before)
    };
    let log = RunLog::open(&path).unwrap();
    let version: i64 = Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(read_back(&log, old), before);
    assert_eq!(log.run(old).unwrap().unwrap().start.batch, None);

    // Runs of a batch go in beside it, and the filter finds exactly them.
    for (execution, batch) in [
        ("run-b1", Some("batch-1")),
        ("run-b2", Some("batch-1")),
        ("run-c", None),
    ] {
        let writer = log.begin_with(
            RunStart {
                batch: batch.map(str::to_owned),
                ..start(execution)
            },
            patient(),
        );
        assert!(writer.flush());
    }
    let batch = log
        .list_runs(&RunFilter {
            batch: Some("batch-1".to_owned()),
            ..RunFilter::default()
        })
        .unwrap();
    let mut names: Vec<&str> = batch.iter().map(|r| r.execution.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["run-b1", "run-b2"]);
    assert!(batch.iter().all(|r| r.batch.as_deref() == Some("batch-1")));
    let id = log.resolve("run-b1").unwrap();
    assert_eq!(
        log.run(id).unwrap().unwrap().start.batch.as_deref(),
        Some("batch-1")
    );
    assert_eq!(log.list_runs(&RunFilter::default()).unwrap().len(), 4);

    // Version 8's search index covers the old run too, and `search` and
    // `batch` narrow together.
    let mut found = search(&log, "review");
    found.sort_unstable();
    assert_eq!(found, ["run-0ld6", "run-b1", "run-b2", "run-c"]);
    let both = log
        .list_runs(&RunFilter {
            batch: Some("batch-1".to_owned()),
            search: Some("review".to_owned()),
            ..RunFilter::default()
        })
        .unwrap();
    let mut names: Vec<&str> = both.iter().map(|r| r.execution.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["run-b1", "run-b2"]);
    assert!(log
        .list_runs(&RunFilter {
            batch: Some("batch-1".to_owned()),
            search: Some("nowhere".to_owned()),
            ..RunFilter::default()
        })
        .unwrap()
        .is_empty());
}

#[test]
fn a_version_5_database_is_migrated_and_reads_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let (id, before) = {
        let log = RunLog::open(&path).unwrap();
        let id = log_every_kind(&log, "run-0ld5");
        let rows = log.stored_rows().unwrap();
        let before = read_back(&log, id);
        drop(log);
        as_version_5(&path, &rows);
        (id, before)
    };
    let columns: Vec<String> = Connection::open(&path)
        .unwrap()
        .prepare("SELECT name FROM pragma_table_info('event_batches')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!columns.iter().any(|c| c == "packed"), "{columns:?}");

    let log = RunLog::open(&path).unwrap();
    let version: i64 = Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let rows = log.stored_rows().unwrap();
    assert!(rows.iter().all(|row| !row.packed));
    assert_eq!(read_back(&log, id), before);

    // A new run goes in packed beside the old rows, which stay as they were.
    let new = log_every_kind(&log, "run-new6");
    let rows = log.stored_rows().unwrap();
    assert_eq!(rows.iter().filter(|row| row.packed).count(), 3);
    assert!(rows
        .iter()
        .filter(|row| row.run == id)
        .all(|row| !row.packed));
    let mut newer = read_back(&log, new);
    newer["run"] = before["run"].clone();
    assert_eq!(read_back(&log, id), before);
    assert_eq!(newer, before);
}

#[test]
fn a_damaged_packed_row_is_an_error_naming_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    let good = log_every_kind(&log, "run-good");
    let bad = log_every_kind(&log, "run-bad");
    let before = read_back(&log, good);
    // The first packed row of `bad`, cut short; its work row, made garbage.
    let conn = Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE event_batches SET packed = substr(packed, 1, length(packed) - 9)
         WHERE run_id = ?1 AND count > 0",
        [bad.0],
    )
    .unwrap();
    conn.execute(
        "UPDATE event_batches SET packed = x'01ffffffff' WHERE run_id = ?1 AND count = 0",
        [bad.0],
    )
    .unwrap();
    for err in [
        log.events(bad).unwrap_err(),
        log.exchanges(bad).unwrap_err(),
        log.tool_calls(bad).unwrap_err(),
        log.stored_rows().unwrap_err(),
    ] {
        assert!(
            matches!(err, RunLogError::BadRow { run, .. } if run == bad.0),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("run #{}", bad.0)) && text.contains("cannot be read"),
            "{text}"
        );
    }
    // The other run reads as before.
    assert_eq!(read_back(&log, good), before);
}

/// Version 9's input index taken away, leaving version 8's schema.
const WITHOUT_INPUT_INDEX: &str = "DROP INDEX runs_completed_input; DROP INDEX runs_by_input;
     ALTER TABLE runs DROP COLUMN input_index;";

/// Versions 9 and 8 taken away (8's search index), leaving version 7's schema.
const WITHOUT_SEARCH_INDEX: &str = "DROP INDEX runs_completed_input; DROP INDEX runs_by_input;
     ALTER TABLE runs DROP COLUMN input_index;
     DROP TRIGGER runs_text_insert; DROP TRIGGER runs_text_delete;
     DROP TRIGGER runs_text_update; DROP TABLE runs_text;";

fn search(log: &RunLog, text: &str) -> Vec<String> {
    log.list_runs(&RunFilter {
        search: Some(text.to_owned()),
        ..RunFilter::default()
    })
    .unwrap()
    .into_iter()
    .map(|r| r.execution)
    .collect()
}

#[test]
fn search_finds_runs_by_prompt_args_result_and_error() {
    let dir = tempfile::tempdir().unwrap();
    let log = RunLog::open(db_in(&dir)).unwrap();
    let mut tides = start("run-tides");
    tides.prompt_path = "notes/tides.md".to_owned();
    tides.args = json!({ "question": "Why does the sea rise?" });
    let writer = log.begin_with(tides, patient());
    assert_eq!(writer.finish(completed("The Moon pulls the oceans")), None);
    let failed = RunEnd {
        outcome: Outcome::Failed {
            kind: "Tool".to_owned(),
            message: "tool \"browse\" is not in this section's scope".to_owned(),
        },
        duration_ms: 1,
        usage: TokenUsage::default(),
    };
    log_run(&log, "run-failed", 0, Some(failed));
    log_run(&log, "run-live", 0, None);

    assert_eq!(search(&log, "tides.md"), ["run-tides"]); // prompt path
    assert_eq!(search(&log, "SEA rise"), ["run-tides"]); // args, any case, every word
    assert_eq!(search(&log, "moon"), ["run-tides"]); // result
    assert_eq!(search(&log, "ocean"), ["run-tides"]); // a word's prefix
    assert_eq!(search(&log, "browse scope"), ["run-failed"]); // error message
    assert_eq!(search(&log, "tool"), ["run-failed"]); // error kind
    assert_eq!(search(&log, "review"), ["run-live", "run-failed"]); // still running too
    assert!(search(&log, "moon browse").is_empty());
    // FTS5 syntax in the text is only text: no error, no match.
    assert!(search(&log, "\"moon\" OR NEAR(x -y:").is_empty());
    assert!(search(&log, " - ").is_empty());
    // Combined with the other filters.
    let found = log
        .list_runs(&RunFilter {
            search: Some("review".to_owned()),
            outcome: Some("failed".to_owned()),
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].execution, "run-failed");
}

#[test]
fn a_version_7_database_gains_the_search_index_over_its_old_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    log_run(
        &log,
        "run-old",
        2,
        Some(completed("an answer about herons")),
    );
    drop(log);
    // Version 7 was version 8 without the index: take it away again.
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(WITHOUT_SEARCH_INDEX).unwrap();
    conn.execute_batch("PRAGMA user_version = 7;").unwrap();
    drop(conn);
    let log = RunLog::open(&path).unwrap();
    assert_eq!(search(&log, "herons"), ["run-old"]);
    log_run(&log, "run-new", 0, Some(completed("an answer about owls")));
    assert_eq!(search(&log, "answer"), ["run-new", "run-old"]);
    assert_eq!(
        log.events(log.resolve("run-old").unwrap()).unwrap().len(),
        2
    );
}

#[test]
fn prune_deletes_finished_runs_with_every_row_and_spares_running_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let mut log = RunLog::open(&path).unwrap();
    let writer = log.begin_with(start("run-1"), patient());
    for seq in 0..5 {
        writer.event(event("0", seq, "lua"));
    }
    writer.exchange(exchange("0", 9));
    writer.tool_call(tool_call("0", 10));
    assert_eq!(writer.finish(completed("first")), None);
    log_run(&log, "run-2", 3, Some(completed("second")));
    log_run(&log, "run-live", 1, None);
    log_run(&log, "run-4", 0, Some(completed("fourth")));

    // Keep the newest two: run-4 and the live run; run-1 and run-2 go.
    let dry = log
        .prune(pf_runlog::PruneSelection::KeepNewest(2), true)
        .unwrap();
    let names: Vec<_> = dry.runs.iter().map(|r| r.execution.as_str()).collect();
    assert_eq!(names, ["run-2", "run-1"]);
    assert!(dry.rows > 2);
    assert_eq!(log.list_runs(&RunFilter::default()).unwrap().len(), 4);

    let done = log
        .prune(pf_runlog::PruneSelection::KeepNewest(2), false)
        .unwrap();
    assert_eq!(done, dry);
    let left: Vec<_> = log
        .list_runs(&RunFilter::default())
        .unwrap()
        .into_iter()
        .map(|r| r.execution)
        .collect();
    assert_eq!(left, ["run-4", "run-live"]);
    assert!(search(&log, "first").is_empty());
    let conn = Connection::open(&path).unwrap();
    for table in ["event_batches", "exchanges", "tool_calls", "events"] {
        let orphans: i64 = conn
            .query_row(
                &format!("SELECT count(*) FROM {table} WHERE run_id NOT IN (SELECT id FROM runs)"),
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(orphans, 0, "{table}");
    }
    // Keeping none still spares the run that has not ended.
    let last = log
        .prune(pf_runlog::PruneSelection::KeepNewest(0), false)
        .unwrap();
    assert_eq!(last.runs.len(), 1);
    assert_eq!(last.runs[0].execution, "run-4");
    let left = log.list_runs(&RunFilter::default()).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].execution, "run-live");
    // By age: nothing started before 1970.
    assert!(log
        .prune(pf_runlog::PruneSelection::StartedBefore(0), false)
        .unwrap()
        .runs
        .is_empty());
}

#[test]
fn a_version_8_database_gains_input_indexes_and_keeps_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let log = RunLog::open(&path).unwrap();
    let old = log_every_kind(&log, "run-0ld8");
    let before = read_back(&log, old);
    drop(log);
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch(WITHOUT_INPUT_INDEX).unwrap();
    conn.execute_batch("PRAGMA user_version = 8;").unwrap();
    drop(conn);
    let log = RunLog::open(&path).unwrap();
    let version: i64 = Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(read_back(&log, old), before);
    assert_eq!(log.run(old).unwrap().unwrap().start.input_index, None);
    // The exactly-once key works on the migrated file: a second completion
    // of one input is logged as a duplicate.
    for execution in ["run-in1", "run-in2"] {
        let writer = log.begin_with(
            RunStart {
                batch: Some("batch-8".to_owned()),
                input_index: Some(4),
                ..start(execution)
            },
            patient(),
        );
        assert_eq!(writer.finish(completed("four")), None);
    }
    let kept = log.input_run("batch-8", 4).unwrap().unwrap();
    assert_eq!(kept.start.execution, "run-in1");
    let second = log.run(log.resolve("run-in2").unwrap()).unwrap().unwrap();
    assert!(matches!(
        second.end.unwrap().outcome,
        pf_runlog::Outcome::Failed { ref kind, .. } if kind == pf_runlog::DUPLICATE_KIND
    ));
}

/// A database at each earlier schema version (the shipped migrations up to
/// it, and a run as every version's writer could store one: a row of
/// `runs` and one old-style event row) is migrated to the current version
/// by opening it: the old run reads back, and new runs, batch inputs
/// included, log and read beside it.
#[test]
fn a_database_at_each_earlier_version_is_migrated_and_keeps_its_run() {
    for version in 1..SCHEMA_VERSION {
        let dir = tempfile::tempdir().unwrap();
        let path = db_in(&dir);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        {
            let conn = Connection::open(&path).unwrap();
            let applied = usize::try_from(version).unwrap();
            for migration in &pf_runlog::schema::MIGRATIONS[..applied] {
                conn.execute_batch(migration).unwrap();
            }
            conn.pragma_update(None, "user_version", version).unwrap();
            conn.execute_batch(
                "INSERT INTO runs (execution, prompt_path, prompt_text, prompt_sha256, args_json,
                     seed, start_rfc3339, start_ms, started_at_ms, outcome, result, duration_ms,
                     input_tokens, output_tokens, total_tokens)
                 VALUES ('run-0ld', 'old.md', '# Old', 'x', '{\"a\":1}', '18446744073709551615',
                     '2025-01-02T03:04:05Z', 5, 6, 'completed', 'kept', 7, 1, 2, 3);
                 INSERT INTO events (run_id, ord, kind, section, task, seq, fields_json)
                 VALUES (1, 0, 'lua', 'Old', '0', 0, '{\"message\":\"old\"}');",
            )
            .unwrap();
        }
        let log = RunLog::open(&path).unwrap();
        let found: i64 = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(found, SCHEMA_VERSION, "from version {version}");
        let old = log.resolve("run-0ld").unwrap();
        let run = log.run(old).unwrap().unwrap();
        assert_eq!(run.start.seed, u64::MAX, "from version {version}");
        assert_eq!(
            run.end.unwrap().outcome,
            Outcome::Completed {
                result: "kept".to_owned()
            }
        );
        let events = log.events(old).unwrap();
        assert_eq!(events.len(), 1, "from version {version}");
        assert_eq!(events[0].fields, json!({"message": "old"}));
        if version >= 8 {
            // Version 8's search index holds the run it was inserted with.
            assert_eq!(search(&log, "old"), ["run-0ld"]);
        }
        for execution in ["run-n1", "run-n2"] {
            let writer = log.begin_with(
                RunStart {
                    batch: Some("b".to_owned()),
                    input_index: Some(0),
                    ..start(execution)
                },
                patient(),
            );
            writer.event(event("0", 0, "lua"));
            assert_eq!(writer.finish(completed("new")), None);
        }
        let kept = log.input_run("b", 0).unwrap().unwrap();
        assert_eq!(kept.start.execution, "run-n1", "from version {version}");
        assert_eq!(log.list_runs(&RunFilter::default()).unwrap().len(), 3);
        assert_eq!(search(&log, "old"), ["run-0ld"], "from version {version}");
    }
}
