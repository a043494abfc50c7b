//! What only the PostgreSQL backend has: its schema's migrations from each
//! earlier version, and the unique index settling two completions of one
//! batch input that commit at the same moment from different machines.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../pf-runlog/tests/common/mod.rs"]
mod common;
mod pg;

use std::time::Duration;

use common::*;
use pf_runlog::{Outcome, RunEnd, RunFilter, RunLog, RunLogError, RunStart, DUPLICATE_KIND};
use pf_runlog_postgres::schema::SCHEMA_VERSION;
use pf_runlog_postgres::PostgresBackend;

fn at_version(url: &str, version: i64) -> RunLog {
    RunLog::open_on(
        PostgresBackend::at_version(pg::location(url), version)
            .unwrap()
            .shared(),
    )
    .unwrap()
}

fn schema_version(url: &str) -> String {
    pg::query(url, "SELECT version FROM runlog_schema")
        .pop()
        .unwrap()
}

#[test]
fn each_earlier_version_is_migrated_and_keeps_its_runs() {
    let Some(server) = pg::server() else { return };
    // From nothing, and from each version this build knows before its own.
    for from in 0..SCHEMA_VERSION {
        let url = pg::fresh_database(&server);
        let before = if from > 0 {
            // The schema as that version left it, and a run as its writer
            // wrote one, by hand: a row of dense event lines, unpacked.
            drop(at_version(&url, from));
            assert_eq!(schema_version(&url), from.to_string());
            pg::admin_on(
                &url,
                "INSERT INTO runs (execution, prompt_path, prompt_text, prompt_sha256, args_json,
                     seed, start_rfc3339, start_ms, started_at_ms, batch, outcome, result,
                     duration_ms, input_tokens, output_tokens, total_tokens)
                 VALUES ('run-0ld', 'p.md', '# P', 'x', '{\"a\":1}', '18446744073709551615',
                     '2025-01-02T03:04:05Z', 5, 6, 'b', 'completed', 'old', 7, 1, 2, 3);
                 INSERT INTO event_batches (run_id, first_ord, count, lines)
                 SELECT id, 0, 2, E'[\"lua\",\"Gather\",\"0\",0,{\"message\":\"one\"}]\n'
                     || E'[\"lua\",\"Gather\",\"0.1\",1]\n' FROM runs;",
            );
            Some(())
        } else {
            None
        };
        let log = RunLog::open_on(pg::backend(&url)).unwrap();
        assert_eq!(
            schema_version(&url),
            SCHEMA_VERSION.to_string(),
            "from {from}"
        );
        if before.is_some() {
            let id = log.resolve("run-0ld").unwrap();
            let run = log.run(id).unwrap().unwrap();
            assert_eq!(run.start.seed, u64::MAX);
            assert_eq!(run.start.args, serde_json::json!({"a": 1}));
            assert_eq!(run.start.batch.as_deref(), Some("b"));
            assert_eq!(run.start.input_index, None);
            assert_eq!(run.outcome_label(), "completed");
            let events = log.events(id).unwrap();
            assert_eq!(events.len(), 2);
            assert_eq!(events[0].fields, serde_json::json!({"message": "one"}));
            assert_eq!(events[1].task, "0.1");
        }
        // What the newest version adds works on the migrated database.
        for n in 0..2 {
            let writer = log.begin_with(
                RunStart {
                    batch: Some("b".to_owned()),
                    input_index: Some(0),
                    ..start(&format!("run-new{n}"))
                },
                patient(),
            );
            assert_eq!(writer.finish(completed("new")), None);
        }
        let kept = log.input_run("b", 0).unwrap().unwrap();
        assert_eq!(kept.start.execution, "run-new0");
    }
}

#[test]
fn a_newer_schema_is_refused_and_left_alone() {
    let Some(server) = pg::server() else { return };
    let url = pg::fresh_database(&server);
    drop(RunLog::open_on(pg::backend(&url)).unwrap());
    pg::admin_on(&url, "UPDATE runlog_schema SET version = 99");
    match RunLog::open_on(pg::backend(&url)) {
        Err(err @ RunLogError::Server { .. }) => {
            let text = err.to_string();
            assert!(text.contains("schema version 99 is newer"), "{text}");
            assert!(text.contains("upgrade promptforge"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(schema_version(&url), "99");
}

#[test]
fn an_unreachable_server_is_a_clear_error_naming_the_url_without_its_password() {
    let port = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap().port()
    };
    let url = format!("postgres://pf:s3cret@127.0.0.1:{port}/runs?connect_timeout=1");
    let started = std::time::Instant::now();
    let err = RunLog::open_on(pg::backend(&url)).unwrap_err().to_string();
    assert!(
        err.contains(&format!("postgres://pf@127.0.0.1:{port}/runs")),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
    // Bounded: readers give up on a server that stays away.
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Another machine's completion of the same input is in flight (updated,
/// not yet committed) when this writer commits its own: the unique index
/// makes this one wait, then refuse; it is logged as the duplicate.
#[test]
fn a_completion_racing_another_machines_is_logged_as_the_duplicate() {
    let Some(server) = pg::server() else { return };
    let url = pg::fresh_database(&server);
    let log = RunLog::open_on(pg::backend(&url)).unwrap();
    let of_input = |execution: &str| RunStart {
        batch: Some("race".to_owned()),
        input_index: Some(5),
        ..start(execution)
    };
    let other = log.begin_with(of_input("run-other"), patient());
    assert!(other.flush());
    let mine = log.begin_with(of_input("run-mine"), patient());
    assert!(mine.flush());
    let other_id = log.resolve("run-other").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, connection) = runtime
        .block_on(tokio_postgres::connect(&url, tokio_postgres::NoTls))
        .unwrap();
    runtime.spawn(connection);
    runtime
        .block_on(client.batch_execute(&format!(
            "BEGIN; UPDATE runs SET outcome = 'completed', result = 'theirs' WHERE id = {}",
            other_id.0
        )))
        .unwrap();
    let finishing = std::thread::spawn(move || mine.finish(completed("mine")));
    // It waits on the other transaction.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!finishing.is_finished());
    runtime.block_on(client.batch_execute("COMMIT")).unwrap();
    assert_eq!(finishing.join().unwrap(), None);
    drop(other);
    let mine = log.run(log.resolve("run-mine").unwrap()).unwrap().unwrap();
    assert!(
        matches!(&mine.end, Some(RunEnd { outcome: Outcome::Failed { kind, .. }, .. }) if kind == DUPLICATE_KIND),
        "{:?}",
        mine.end
    );
    let kept = log.input_run("race", 5).unwrap().unwrap();
    assert_eq!(kept.id, other_id);
    let completed_runs = log
        .list_runs(&RunFilter {
            batch: Some("race".to_owned()),
            outcome: Some("completed".to_owned()),
            ..RunFilter::default()
        })
        .unwrap();
    assert_eq!(completed_runs.len(), 1);
}
