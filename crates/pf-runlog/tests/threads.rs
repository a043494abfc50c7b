#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One writer thread per database: a process running one run after another
//! or many at once (`promptforge mcp`, `promptforge test`) spawns one thread
//! for the database they share, not one per run, and every run is still
//! logged whole. Its own test binary, so no other test's writers share the
//! process.

mod common;

use common::{completed, event, exchange, patient, start};
use pf_runlog::RunLog;
use std::time::Duration;

/// The process's threads named as the run log names its writer threads.
#[cfg(target_os = "linux")]
fn writer_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "pf-runlog")
        .count()
}

#[test]
fn runs_one_after_another_and_runs_at_once_share_one_writer_thread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let log = RunLog::open(&path).unwrap();
    for run in 0..12u32 {
        let writer = log.begin_with(start(&format!("run-thread-{run:02}")), patient());
        for seq in 0..20 {
            writer.event(event("0", seq, "lua"));
        }
        writer.exchange(exchange("0", 20));
        let tail = writer.finish_deferred(completed(&format!("r{run}")));
        // Ended before the database's thread may have looked at it.
        assert_eq!(tail.wait(Duration::from_secs(120)), None);
        // The database's thread outlives the run and takes the next one
        // (a thread not yet started has not named itself: at most one).
        #[cfg(target_os = "linux")]
        assert!(writer_threads() <= 1, "after run {run}");
    }
    for run in 0..12u32 {
        let id = log.resolve(&format!("run-thread-{run:02}")).unwrap();
        let logged = log.run(id).unwrap().expect("run row");
        assert_eq!(logged.end, Some(completed(&format!("r{run}"))));
        assert_eq!(log.events(id).unwrap().len(), 20);
        assert_eq!(log.exchanges(id).unwrap().len(), 1);
    }
    // (One test: tests run in parallel, and this one counts the process's
    // threads.) Three writers open at once, then all finished: the same
    // thread serves them all.
    for round in 0..3u32 {
        let writers: Vec<_> = (0..3u32)
            .map(|n| log.begin_with(start(&format!("run-at-once-{round}-{n}")), patient()))
            .collect();
        for writer in &writers {
            writer.event(event("0", 0, "lua"));
        }
        #[cfg(target_os = "linux")]
        assert!(writer_threads() <= 1, "round {round}");
        let tails: Vec<_> = writers
            .into_iter()
            .map(|writer| writer.finish_deferred(completed("done")))
            .collect();
        for tail in tails {
            assert_eq!(tail.wait(Duration::from_secs(120)), None);
        }
    }
    // By now the database's thread has started and named itself: exactly
    // one (bounded far above the milliseconds it takes).
    #[cfg(target_os = "linux")]
    {
        let mut threads = writer_threads();
        for _ in 0..1000 {
            if threads == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            threads = writer_threads();
        }
        assert_eq!(threads, 1);
    }
    for round in 0..3u32 {
        for n in 0..3u32 {
            let id = log.resolve(&format!("run-at-once-{round}-{n}")).unwrap();
            assert_eq!(
                log.run(id).unwrap().expect("row").end,
                Some(completed("done"))
            );
            assert_eq!(log.events(id).unwrap().len(), 1);
        }
    }
}
