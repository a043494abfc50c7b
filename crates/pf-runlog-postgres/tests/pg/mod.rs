//! A database of its own for each test on the PostgreSQL server the test
//! tier started (`tests/tools/postgres.sh`, which exports
//! `PROMPTFORGE_TEST_POSTGRES_URL`). Without one the PostgreSQL half of a
//! test is skipped with a note, except under CI, where it fails loudly.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pf_runlog::RunLogBackend;
use pf_runlog_postgres::{PgLocation, PostgresBackend, UrlSource};

pub const URL_VAR: &str = "PROMPTFORGE_TEST_POSTGRES_URL";

/// The server's superuser URL, or `None` (skip) outside CI.
pub fn server() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => panic!(
            "{URL_VAR} is not set under CI: the PostgreSQL run-log tests need the server \
             test.sh starts (crates/promptforge/tests/tools/postgres.sh)"
        ),
        _ => {
            eprintln!("note: {URL_VAR} not set; the PostgreSQL half of this test is skipped");
            None
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Run `sql` on the server's `postgres` database.
pub fn admin(server: &str, sql: &str) {
    let server = server.to_owned();
    let sql = sql.to_owned();
    runtime().block_on(async move {
        let (client, connection) = tokio_postgres::connect(&server, tokio_postgres::NoTls)
            .await
            .unwrap();
        let task = tokio::spawn(connection);
        client.batch_execute(&sql).await.unwrap();
        drop(client);
        let _ = task.await;
    });
}

/// A new, empty database on the server: its URL.
pub fn fresh_database(server: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "pf_test_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    admin(server, &format!("CREATE DATABASE {name}"));
    let (base, _) = server.rsplit_once('/').unwrap();
    format!("{base}/{name}")
}

pub fn location(url: &str) -> PgLocation {
    PgLocation::parse(url, UrlSource::Environment, &|name| {
        std::env::var(name).ok()
    })
    .unwrap()
}

/// A backend on `url` (a database `fresh_database` made).
pub fn backend(url: &str) -> Arc<dyn RunLogBackend> {
    PostgresBackend::new(location(url)).unwrap().shared()
}

/// Run `sql` on the database at `url`, returning the first column of each row as text.
pub fn query(url: &str, sql: &str) -> Vec<String> {
    let url = url.to_owned();
    let sql = sql.to_owned();
    runtime().block_on(async move {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let task = tokio::spawn(connection);
        let rows = client.simple_query(&sql).await.unwrap();
        drop(client);
        let _ = task.await;
        rows.into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => {
                    Some(row.get(0).unwrap_or("NULL").to_owned())
                }
                _ => None,
            })
            .collect()
    })
}

/// Restart the test server (stop fast, start on the same port).
pub fn restart_server() {
    let dir = std::env::var("PROMPTFORGE_TEST_POSTGRES_DIR")
        .expect("PROMPTFORGE_TEST_POSTGRES_DIR (set by postgres.sh start)");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../promptforge/tests/tools/postgres.sh"
    );
    let status = std::process::Command::new("bash")
        .args([script, "restart", &dir])
        .status()
        .unwrap();
    assert!(status.success(), "postgres.sh restart failed");
}

/// Run `sql` on the database at `url`.
pub fn admin_on(url: &str, sql: &str) {
    admin(url, sql);
}
