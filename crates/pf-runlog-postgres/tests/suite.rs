//! The run log's test suite against both backends: each test runs once on
//! a SQLite file and once on a PostgreSQL database of its own (see
//! `pg/mod.rs` for where the server comes from).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../pf-runlog/tests/common/mod.rs"]
mod common;
mod pg;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use pf_runlog::{
    ActivationRecord, ExchangeDraft, Outcome, PruneSelection, RunEnd, RunFilter, RunId, RunLog,
    RunLogBackend, RunLogError, RunStart, SqliteBackend, DUPLICATE_KIND,
};
use serde_json::json;

/// Where a test's log lives; the temporary folder lives as long as it.
struct Target {
    backend: Arc<dyn RunLogBackend>,
    _dir: Option<tempfile::TempDir>,
}

impl Target {
    fn open(&self) -> RunLog {
        RunLog::open_on(Arc::clone(&self.backend)).unwrap()
    }
}

fn sqlite() -> Option<Target> {
    let dir = tempfile::tempdir().unwrap();
    let backend = SqliteBackend::shared(dir.path().join("runs.db"));
    Some(Target {
        backend,
        _dir: Some(dir),
    })
}

fn postgres() -> Option<Target> {
    let server = pg::server()?;
    Some(Target {
        backend: pg::backend(&pg::fresh_database(&server)),
        _dir: None,
    })
}

/// Each test, once a backend.
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(#[test] fn $name() { if let Some(t) = super::sqlite() { super::$name(&t) } })*
        }
        mod on_postgres {
            $(#[test] fn $name() { if let Some(t) = super::postgres() { super::$name(&t) } })*
        }
    };
}

both!(
    everything_written_reads_back_in_order,
    lists_filter_and_resolve,
    an_unfinished_run_reads_as_running_and_its_rows_so_far,
    a_continued_request_reads_back_whole,
    one_batch_input_has_at_most_one_completed_run,
    racing_completions_of_one_input_keep_one,
    input_run_finds_the_run_a_redelivery_acts_on,
    prune_deletes_finished_runs_and_spares_running_ones,
    many_runs_at_once_each_read_back_whole,
);

fn log_run(log: &RunLog, start: RunStart, events: u32, end: Option<RunEnd>) -> RunId {
    let execution = start.execution.clone();
    let writer = log.begin_with(start, patient());
    for seq in 0..events {
        writer.event(event("0", seq, "lua"));
    }
    match end {
        Some(end) => assert_eq!(writer.finish(end), None),
        None => assert!(writer.flush()),
    }
    log.resolve(&execution).unwrap()
}

fn everything_written_reads_back_in_order(t: &Target) {
    let log = t.open();
    let mut run_start = start("run-00aa11bb22cc33dd");
    run_start.replay_of = Some("run-ffff000011112222".to_owned());
    run_start.batch = Some("batch-x".to_owned());
    run_start.input_index = Some(3);
    let writer = log.begin_with(run_start.clone(), patient());
    let mut events = Vec::new();
    for seq in 0..300u32 {
        let task = if seq % 3 == 0 { "0.1" } else { "0" };
        let e = event(task, seq, "store_write_succeeded");
        writer.event(e.clone());
        events.push(e);
        if seq == 150 {
            // Two commits: rows of the same run read back in order.
            assert!(writer.flush());
        }
    }
    let exchanges = vec![exchange("0", 300), exchange("0", 301)];
    for x in &exchanges {
        writer.exchange(x.clone());
    }
    let tools = vec![tool_call("0", 302)];
    writer.tool_call(tools[0].clone());
    let answers = vec![answer("0", 304)];
    writer.answer(answers[0].clone());
    let activations = vec![ActivationRecord {
        plugin: "acme/gone".to_owned(),
        tools: None,
        error: Some("failed to initialize".to_owned()),
    }];
    writer.activation(activations[0].clone());
    let end = completed("the result");
    assert_eq!(writer.finish(end.clone()), None);

    let id = log.resolve("run-00aa11bb22cc33dd").unwrap();
    let run = log.run(id).unwrap().unwrap();
    assert_eq!(run.start, run_start);
    assert_eq!(run.end, Some(end));
    assert!(run.prompt_text_intact());
    assert!(run.finished_at_ms.is_some());
    assert_eq!(log.events(id).unwrap(), events);
    assert_eq!(log.exchanges(id).unwrap(), exchanges);
    assert_eq!(log.tool_calls(id).unwrap(), tools);
    assert_eq!(log.answers(id).unwrap(), answers);
    assert_eq!(log.activations(id).unwrap(), activations);
    let child: Vec<_> = events.iter().filter(|e| e.task == "0.1").cloned().collect();
    let after: Vec<_> = child.iter().filter(|e| e.seq > 150).cloned().collect();
    assert_eq!(log.events_of_task(id, "0.1", Some(150)).unwrap(), after);
    // An audit reads every stored row's text (packed or not).
    let stored = log.stored_rows().unwrap();
    assert!(stored.iter().all(|row| row.run == id));
    assert!(stored
        .iter()
        .any(|row| row.lines.contains("store_write_succeeded")));
}

fn lists_filter_and_resolve(t: &Target) {
    let log = t.open();
    let mut a = start("run-aaaa1111");
    a.prompt_path = "prompts/herons.md".to_owned();
    a.args = json!({"topic": "grey herons"});
    log_run(&log, a, 1, Some(completed("about herons")));
    let mut b = start("run-aaaa2222");
    b.batch = Some("batch-1".to_owned());
    log_run(
        &log,
        b,
        1,
        Some(RunEnd {
            outcome: Outcome::Failed {
                kind: "Model".to_owned(),
                message: "the owl refused".to_owned(),
            },
            ..completed("")
        }),
    );
    log_run(&log, start("run-bbbb3333"), 0, None);

    let all = log.list_runs(&RunFilter::default()).unwrap();
    let names: Vec<&str> = all.iter().map(|r| r.execution.as_str()).collect();
    assert_eq!(names, ["run-bbbb3333", "run-aaaa2222", "run-aaaa1111"]);
    assert_eq!(all[0].outcome, "running");
    let only = |filter: RunFilter| -> Vec<String> {
        log.list_runs(&filter)
            .unwrap()
            .into_iter()
            .map(|r| r.execution)
            .collect()
    };
    assert_eq!(
        only(RunFilter {
            limit: Some(1),
            ..RunFilter::default()
        }),
        ["run-bbbb3333"]
    );
    assert_eq!(
        only(RunFilter {
            prompt: Some("herons".to_owned()),
            ..RunFilter::default()
        }),
        ["run-aaaa1111"]
    );
    assert_eq!(
        only(RunFilter {
            outcome: Some("failed".to_owned()),
            ..RunFilter::default()
        }),
        ["run-aaaa2222"]
    );
    assert_eq!(
        only(RunFilter {
            outcome: Some("running".to_owned()),
            ..RunFilter::default()
        }),
        ["run-bbbb3333"]
    );
    assert_eq!(
        only(RunFilter {
            batch: Some("batch-1".to_owned()),
            ..RunFilter::default()
        }),
        ["run-aaaa2222"]
    );
    // Search: every word, as a word's beginning, case-insensitive, over
    // path, arguments, result and error; the user's text is never syntax.
    for (text, expected) in [
        ("HERON", vec!["run-aaaa1111"]),
        ("grey about", vec!["run-aaaa1111"]),
        ("owl refused", vec!["run-aaaa2222"]),
        ("eron", vec![]),
        ("herons.md", vec!["run-aaaa1111"]),
        ("\"AND\" -- (", vec![]),
        ("...", vec![]),
    ] {
        assert_eq!(
            only(RunFilter {
                search: Some(text.to_owned()),
                ..RunFilter::default()
            }),
            expected,
            "search {text:?}"
        );
    }
    // Resolving.
    let newest = log.resolve("last").unwrap();
    assert_eq!(
        log.run(newest).unwrap().unwrap().start.execution,
        "run-bbbb3333"
    );
    assert_eq!(log.resolve(&format!("#{}", newest.0)).unwrap(), newest);
    assert_eq!(log.resolve("bbbb").unwrap(), newest);
    assert!(matches!(
        log.resolve("aaaa"),
        Err(RunLogError::Ambiguous { matches: 2, .. })
    ));
    match log.resolve("zzzz") {
        Err(RunLogError::Unknown { recent, .. }) => assert_eq!(recent.len(), 3),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        log.resolve("#999999"),
        Err(RunLogError::Unknown { .. })
    ));
}

fn an_unfinished_run_reads_as_running_and_its_rows_so_far(t: &Target) {
    let log = t.open();
    let writer = log.begin_with(start("run-cafe"), patient());
    for seq in 0..5 {
        writer.event(event("0", seq, "lua"));
    }
    assert!(writer.flush());
    // Read while the run goes on: what is committed so far.
    let id = log.resolve("run-cafe").unwrap();
    assert_eq!(log.run(id).unwrap().unwrap().outcome_label(), "running");
    assert_eq!(log.events(id).unwrap().len(), 5);
    writer.event(event("0", 5, "lua"));
    assert_eq!(writer.finish(completed("ok")), None);
    assert_eq!(log.events(id).unwrap().len(), 6);
    assert_eq!(log.run(id).unwrap().unwrap().outcome_label(), "completed");
}

fn said(n: usize) -> serde_json::Value {
    json!({"role": "user", "content": format!("message {n}")})
}

fn a_continued_request_reads_back_whole(t: &Target) {
    let log = t.open();
    let writer = log.begin_with(start("run-de17a"), patient());
    let draft = |seq: u32, messages: Vec<serde_json::Value>, extends| ExchangeDraft {
        task: "0".to_owned(),
        seq,
        section: "Loop".to_owned(),
        model: "small".to_owned(),
        attempt: 1,
        request_json: json!({"messages": messages, "temperature": 0.5}).to_string(),
        extends,
        same_tools: false,
        response_json: Some(json!({"content": format!("reply {seq}")}).to_string()),
        error: None,
        status: None,
        started_ms: 7,
        duration_ms: 1,
        usage: None,
    };
    let first = writer.exchange_draft(draft(1, vec![said(0)], None));
    assert!(writer.flush());
    writer.exchange_draft(draft(2, vec![said(1)], Some(first)));
    assert_eq!(writer.finish(completed("done")), None);
    let id = log.resolve("last").unwrap();
    let requests: Vec<serde_json::Value> = log
        .exchanges(id)
        .unwrap()
        .into_iter()
        .map(|x| x.request)
        .collect();
    assert_eq!(
        requests,
        [
            json!({"messages": [said(0)], "temperature": 0.5}),
            json!({"messages": [said(0), said(1)], "temperature": 0.5}),
        ]
    );
}

fn of_input(execution: &str, batch: &str, index: u64) -> RunStart {
    RunStart {
        batch: Some(batch.to_owned()),
        input_index: Some(index),
        ..start(execution)
    }
}

fn is_duplicate(end: &Option<RunEnd>) -> bool {
    matches!(end, Some(RunEnd { outcome: Outcome::Failed { kind, .. }, .. }) if kind == DUPLICATE_KIND)
}

fn one_batch_input_has_at_most_one_completed_run(t: &Target) {
    let log = t.open();
    let first = log_run(
        &log,
        of_input("run-one1", "b", 7),
        1,
        Some(completed("seven")),
    );
    let second = log_run(
        &log,
        of_input("run-one2", "b", 7),
        1,
        Some(completed("seven again")),
    );
    // Other inputs, other batches, and failures are not affected.
    log_run(
        &log,
        of_input("run-one3", "b", 8),
        0,
        Some(completed("eight")),
    );
    log_run(
        &log,
        of_input("run-one4", "c", 7),
        0,
        Some(completed("other batch")),
    );
    let failed = RunEnd {
        outcome: Outcome::Failed {
            kind: "Model".to_owned(),
            message: "no".to_owned(),
        },
        ..completed("")
    };
    log_run(&log, of_input("run-one5", "b", 7), 0, Some(failed.clone()));
    assert_eq!(
        log.run(first).unwrap().unwrap().outcome_label(),
        "completed"
    );
    let kept = log.run(second).unwrap().unwrap();
    assert!(is_duplicate(&kept.end), "{:?}", kept.end);
    let completed_runs = log
        .list_runs(&RunFilter {
            batch: Some("b".to_owned()),
            outcome: Some("completed".to_owned()),
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(completed_runs.len(), 2);
}

/// Completions of one input from many writers at once (each its own
/// backend object: its own writer thread and connection, as separate
/// processes have): exactly one is kept.
fn racing_completions_of_one_input_keep_one(t: &Target) {
    let log = t.open();
    std::thread::scope(|scope| {
        for n in 0..6 {
            let backend = Arc::clone(&t.backend);
            scope.spawn(move || {
                let log = RunLog::open_on(backend).unwrap();
                let writer =
                    log.begin_with(of_input(&format!("run-race{n}"), "race", 1), patient());
                writer.event(event("0", 0, "lua"));
                assert!(writer.flush());
                assert_eq!(writer.finish(completed(&format!("answer {n}"))), None);
            });
        }
    });
    let runs = log
        .list_runs(&RunFilter {
            batch: Some("race".to_owned()),
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(runs.len(), 6);
    let completed: Vec<_> = runs.iter().filter(|r| r.outcome == "completed").collect();
    assert_eq!(completed.len(), 1, "{runs:?}");
    for run in runs.iter().filter(|r| r.outcome != "completed") {
        assert!(is_duplicate(&log.run(run.id).unwrap().unwrap().end));
    }
}

fn input_run_finds_the_run_a_redelivery_acts_on(t: &Target) {
    let log = t.open();
    assert_eq!(log.input_run("q", 0).unwrap(), None);
    // A run that was killed (no end): the newest run of the input, to resume.
    let killed = log_run(&log, of_input("run-kill", "q", 0), 3, None);
    let found = log.input_run("q", 0).unwrap().unwrap();
    assert_eq!(found.id, killed);
    assert_eq!(found.end, None);
    // A newer failed run is newer; a completed one wins over anything newer.
    let done = log_run(
        &log,
        of_input("run-done", "q", 0),
        1,
        Some(completed("zero")),
    );
    log_run(
        &log,
        of_input("run-late", "q", 0),
        0,
        Some(RunEnd {
            outcome: Outcome::Cancelled,
            ..completed("")
        }),
    );
    let found = log.input_run("q", 0).unwrap().unwrap();
    assert_eq!(found.id, done);
    assert_eq!(
        found.end.unwrap().outcome,
        Outcome::Completed {
            result: "zero".to_owned()
        }
    );
    assert_eq!(log.input_run("q", 1).unwrap(), None);
    assert_eq!(log.input_run("other", 0).unwrap(), None);
}

fn prune_deletes_finished_runs_and_spares_running_ones(t: &Target) {
    let mut log = t.open();
    log_run(&log, start("run-p1"), 3, Some(completed("1")));
    log_run(&log, start("run-p2"), 2, Some(completed("2")));
    let running = log_run(&log, start("run-p3"), 1, None);
    log_run(&log, start("run-p4"), 1, Some(completed("4")));
    let dry = log.prune(PruneSelection::KeepNewest(1), true).unwrap();
    let names: Vec<&str> = dry.runs.iter().map(|r| r.execution.as_str()).collect();
    assert_eq!(names, ["run-p2", "run-p1"]);
    // Two runs and their two event rows.
    assert_eq!(dry.rows, 4);
    assert_eq!(log.list_runs(&RunFilter::default()).unwrap().len(), 4);
    let done = log.prune(PruneSelection::KeepNewest(1), false).unwrap();
    assert_eq!(done, dry);
    let left: Vec<String> = log
        .list_runs(&RunFilter::default())
        .unwrap()
        .into_iter()
        .map(|r| r.execution)
        .collect();
    assert_eq!(left, ["run-p4", "run-p3"]);
    assert_eq!(log.events(running).unwrap().len(), 1);
    let none = log.prune(PruneSelection::StartedBefore(0), false).unwrap();
    assert!(none.runs.is_empty());
}

fn many_runs_at_once_each_read_back_whole(t: &Target) {
    let log = t.open();
    std::thread::scope(|scope| {
        for n in 0..8 {
            let backend = Arc::clone(&t.backend);
            scope.spawn(move || {
                let writer = pf_runlog::RunWriter::begin_on(
                    backend,
                    start(&format!("run-many{n}")),
                    patient(),
                );
                for seq in 0..50 {
                    writer.event(event("0", seq, "lua"));
                    if seq % 10 == 9 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                assert_eq!(writer.finish(completed(&n.to_string())), None);
            });
        }
    });
    for n in 0..8 {
        let id = log.resolve(&format!("run-many{n}")).unwrap();
        let events = log.events(id).unwrap();
        assert_eq!(events.len(), 50);
        assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u32));
    }
}
