//! Many writers at once (threads and processes) and a writer killed with
//! SIGKILL. Child processes are this test binary run again with
//! `CHILD_DB` set, so they use the real crate exactly as a Host would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use pf_runlog::{RunFilter, RunLog, RunWriter};

const CHILD_DB: &str = "PF_RUNLOG_TEST_CHILD_DB";
const CHILD_MODE: &str = "PF_RUNLOG_TEST_CHILD_MODE";
const CHILD_EXECUTION: &str = "PF_RUNLOG_TEST_CHILD_EXECUTION";

const WRITERS: usize = 20;
const EVENTS: u32 = 200;
const EXCHANGES: u32 = 10;
const TOOL_CALLS: u32 = 10;
const ANSWERS: u32 = 5;
const KILLED_EVENTS: u32 = 50;
const UNFLUSHED_EVENTS: u32 = 10;

/// One run as every writer in these tests logs it.
fn write_one_run(writer: &RunWriter) {
    for seq in 0..EVENTS {
        writer.event(event("0", seq, "lua"));
        if seq % 20 == 0 {
            writer.exchange(exchange("0", EVENTS + seq));
            writer.tool_call(tool_call("0", 2 * EVENTS + seq));
        }
        if seq % 40 == 0 {
            writer.answer(answer("0", 3 * EVENTS + seq));
        }
    }
}

/// Check that every run in `executions` is there in full and finished.
fn assert_all_logged(path: &Path, executions: &[String]) {
    let log = RunLog::open(path).unwrap();
    let runs = log.list_runs(&RunFilter::default()).unwrap();
    assert_eq!(runs.len(), executions.len());
    for execution in executions {
        let id = log.resolve(execution).unwrap();
        let run = log.run(id).unwrap().unwrap();
        assert_eq!(run.outcome_label(), "completed", "{execution}");
        let seqs: Vec<u32> = log.events(id).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (0..EVENTS).collect::<Vec<_>>(), "{execution}");
        assert_eq!(log.exchanges(id).unwrap().len(), EXCHANGES as usize);
        assert_eq!(log.tool_calls(id).unwrap().len(), TOOL_CALLS as usize);
        assert_eq!(log.answers(id).unwrap().len(), ANSWERS as usize);
    }
}

#[test]
fn twenty_threads_with_their_own_connections_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let executions: Vec<String> = (0..WRITERS).map(|i| format!("run-thread{i:02}")).collect();
    let handles: Vec<_> = executions
        .iter()
        .cloned()
        .map(|execution| {
            let path = path.clone();
            std::thread::spawn(move || {
                let log = RunLog::open(&path).unwrap();
                let writer = log.begin_with(start(&execution), patient());
                write_one_run(&writer);
                writer.finish(completed("ok"))
            })
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join().unwrap(), None);
    }
    assert_all_logged(&path, &executions);
}

fn spawn_child(path: &Path, mode: &str, execution: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "child_process_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, path)
        .env(CHILD_MODE, mode)
        .env(CHILD_EXECUTION, execution)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn twenty_processes_at_once_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let executions: Vec<String> = (0..WRITERS).map(|i| format!("run-process{i:02}")).collect();
    let children: Vec<_> = executions
        .iter()
        .map(|execution| spawn_child(&path, "write", execution))
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{:?}", output);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("CHILD DONE"), "{stdout}");
    }
    assert_all_logged(&path, &executions);
}

#[test]
fn a_sigkilled_writer_keeps_what_it_committed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let mut child = spawn_child(&path, "wait", "run-killed");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut saw = |marker: &str| {
        for line in lines.by_ref() {
            if line.unwrap().contains(marker) {
                return;
            }
        }
        panic!("the child ended before printing {marker}");
    };
    saw("CHILD FLUSHED");
    saw("CHILD SENT MORE");

    // The later events were never flushed: the writer's own batching must
    // commit them. Poll for them; the deadline only guards against a hang.
    let log = RunLog::open(&path).unwrap();
    let id = log.resolve("run-killed").unwrap();
    let guard = Instant::now() + Duration::from_secs(120);
    while log.events(id).unwrap().len() < (KILLED_EVENTS + UNFLUSHED_EVENTS) as usize {
        assert!(
            Instant::now() < guard,
            "batched events were never committed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();

    let log = RunLog::open(&path).unwrap();
    let run = log.run(id).unwrap().unwrap();
    assert_eq!(run.outcome_label(), "running");
    let seqs: Vec<u32> = log.events(id).unwrap().iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (0..KILLED_EVENTS + UNFLUSHED_EVENTS).collect::<Vec<_>>()
    );
    // The database is healthy for the next run.
    let writer = log.begin_with(start("run-after"), patient());
    writer.event(event("0", 0, "run_started"));
    assert_eq!(writer.finish(completed("ok")), None);
    assert_eq!(log.events(log.resolve("last").unwrap()).unwrap().len(), 1);
}

/// Not a test of its own: the body of the child processes above. Without
/// the environment variables it does nothing.
#[test]
fn child_process_entry() {
    let (Some(path), Some(mode), Some(execution)) = (
        std::env::var_os(CHILD_DB),
        std::env::var(CHILD_MODE).ok(),
        std::env::var(CHILD_EXECUTION).ok(),
    ) else {
        return;
    };
    let writer = RunWriter::begin_with(path, start(&execution), patient());
    match mode.as_str() {
        "write" => {
            write_one_run(&writer);
            assert_eq!(writer.finish(completed("ok")), None);
            println!("CHILD DONE");
        }
        "wait" => {
            for seq in 0..KILLED_EVENTS {
                writer.event(event("0", seq, "lua"));
            }
            assert!(writer.flush());
            println!("CHILD FLUSHED");
            for seq in KILLED_EVENTS..KILLED_EVENTS + UNFLUSHED_EVENTS {
                writer.event(event("0", seq, "lua"));
            }
            println!("CHILD SENT MORE");
            // Wait to be killed, never finishing. Should the parent die
            // first, its end of stdin closes and the child leaves too.
            let mut rest = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut rest);
            std::process::exit(3);
        }
        other => panic!("unknown child mode {other}"),
    }
}
