//! The server restarts while runs are logging: the writer keeps their rows,
//! reconnects and commits them; readers reconnect too. (Its own test
//! binary: it restarts the shared test server, which no other test of this
//! crate uses at the same time.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../pf-runlog/tests/common/mod.rs"]
mod common;
mod pg;

use common::*;
use pf_runlog::RunLog;

#[test]
fn a_server_restart_mid_run_loses_no_row() {
    let Some(server) = pg::server() else { return };
    let url = pg::fresh_database(&server);
    let log = RunLog::open_on(pg::backend(&url)).unwrap();
    let writer = log.begin_with(start("run-restart"), patient());
    for seq in 0..50 {
        writer.event(event("0", seq, "lua"));
    }
    assert!(writer.flush());
    pg::restart_server();
    // Rows logged after the restart go in on a new connection.
    for seq in 50..100 {
        writer.event(event("0", seq, "lua"));
    }
    assert_eq!(writer.finish(completed("after the restart")), None);
    let id = log.resolve("run-restart").unwrap();
    let events = log.events(id).unwrap();
    assert_eq!(events.len(), 100);
    assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u32));
    assert_eq!(log.run(id).unwrap().unwrap().outcome_label(), "completed");
}
