//! The run log on PostgreSQL: one database that many processes on many
//! machines log into at once (`[runlog] url = "postgres://USER@HOST:PORT/DB"`
//! or `PROMPTFORGE_RUNLOG_URL`). It is a [`pf_runlog::RunLogBackend`]: the
//! same rows as SQLite's, committed by the same writer (each run's rows as
//! it goes, one transaction a window for every run of the process), read
//! back through the same decoding.
//!
//! The client is `tokio-postgres` behind a `deadpool-postgres` pool, on a
//! small runtime of this crate's own: the log's callers are synchronous
//! (the writer's thread, `runs`, `show`) or inside someone else's runtime
//! (`mcp`, `batch`), so every call is spawned here and waited for.
//! A lost connection (a server restart, a network blip) is retried with a
//! new one for a bounded time; the rows wait in the writer meanwhile.

mod location;
mod runtime;
pub mod schema;
mod store;
mod write;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pf_runlog::{CommitConnection, ConnectSettings, RunLogBackend, RunLogError, RunStore};

pub use location::{is_postgres_url, LocationError, PgLocation, UrlSource};

/// How long a reader keeps trying to reach a server that is away.
const READ_RETRY_FOR: Duration = Duration::from_secs(20);
/// How long the writer keeps trying to commit to a server that is away (a
/// restart takes seconds); the rows wait in memory meanwhile.
const WRITE_RETRY_FOR: Duration = Duration::from_secs(60);
/// Connections a process keeps to the server: the writer's thread, a
/// reader or two, a commit on a finishing run's own thread.
const POOL_SIZE: usize = 4;

/// A PostgreSQL run log.
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    location: PgLocation,
    pool: Pool,
    /// Migrated by this process already (once a process per database).
    migrated: AtomicBool,
    /// Test-only: the schema version to stop migrating at.
    target_version: i64,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// A backend for `location` (nothing is connected until it is used).
    pub fn new(location: PgLocation) -> Result<PostgresBackend, String> {
        PostgresBackend::at_version(location, schema::SCHEMA_VERSION)
    }

    /// TEST-ONLY: a backend that migrates only up to `version`, to write a
    /// database as an earlier build did.
    #[doc(hidden)]
    pub fn at_version(location: PgLocation, version: i64) -> Result<PostgresBackend, String> {
        let manager = Manager::from_config(
            location.client_config(),
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(15)))
            .build()
            .map_err(|err| format!("run log {}: {err}", location.shown()))?;
        Ok(PostgresBackend {
            inner: Arc::new(Inner {
                location,
                pool,
                migrated: AtomicBool::new(false),
                target_version: version,
            }),
        })
    }

    /// The backend as the run log shares it.
    pub fn shared(self) -> Arc<dyn RunLogBackend> {
        Arc::new(self)
    }

    /// The URL as messages show it (never the password).
    pub fn shown(&self) -> &str {
        self.inner.location.shown()
    }
}

impl RunLogBackend for PostgresBackend {
    fn name(&self) -> String {
        self.inner.location.shown().to_owned()
    }

    fn key(&self) -> String {
        format!("postgres:{}", self.inner.location.shown())
    }

    fn open(&self) -> Result<Box<dyn RunStore>, RunLogError> {
        let store = store::PgStore::new(Arc::clone(&self.inner));
        // Reach the server (and migrate) now: `runs` on a log that cannot
        // be reached says so at once.
        store.check()?;
        Ok(Box::new(store))
    }

    fn connect(&self, _settings: &ConnectSettings) -> Result<Box<dyn CommitConnection>, String> {
        Ok(Box::new(write::PgCommit::new(Arc::clone(&self.inner))))
    }
}

/// Why a call to the server failed, and whether trying again may help.
#[derive(Debug)]
pub(crate) struct PgFail {
    pub transient: bool,
    pub detail: String,
}

impl PgFail {
    pub(crate) fn from_pg(err: &tokio_postgres::Error) -> PgFail {
        PgFail {
            transient: transient(err),
            detail: describe(err),
        }
    }

    pub(crate) fn from_pool(err: deadpool_postgres::PoolError) -> PgFail {
        match err {
            deadpool_postgres::PoolError::Backend(err) => PgFail::from_pg(&err),
            deadpool_postgres::PoolError::Timeout(kind) => PgFail {
                transient: true,
                detail: format!("timed out waiting for a connection ({kind:?})"),
            },
            other => PgFail {
                transient: false,
                detail: other.to_string(),
            },
        }
    }

    pub(crate) fn fixed(detail: impl Into<String>) -> PgFail {
        PgFail {
            transient: false,
            detail: detail.into(),
        }
    }
}

/// An error's text with the server's detail (tokio-postgres's own text is
/// often just "db error").
fn describe(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(err) {
            Some(source) => format!("{err}: {source}"),
            None => err.to_string(),
        },
    }
}

/// Whether waiting and trying again may help: the connection was lost or
/// refused (a restart), the server is starting or shutting down, or a
/// transaction lost a serialization race.
fn transient(err: &tokio_postgres::Error) -> bool {
    if err.is_closed() {
        return true;
    }
    match err.code() {
        Some(code) => {
            let code = code.code();
            code.starts_with("08")
                || code.starts_with("57P")
                || matches!(code, "40001" | "40P01" | "53300")
        }
        // No SQLSTATE: the socket (refused, reset, timed out).
        None => std::error::Error::source(err).is_some_and(|source| source.is::<std::io::Error>()),
    }
}

/// Get a connection, migrating the database first if this process has not.
pub(crate) async fn client(inner: &Inner) -> Result<deadpool_postgres::Object, PgFail> {
    let mut client = inner.pool.get().await.map_err(PgFail::from_pool)?;
    if !inner.migrated.load(Ordering::SeqCst) {
        let pg: &mut tokio_postgres::Client = &mut client;
        match schema::migrate(pg, inner.target_version)
            .await
            .map_err(|err| PgFail::from_pg(&err))?
        {
            schema::Migrated::Current => inner.migrated.store(true, Ordering::SeqCst),
            schema::Migrated::TooNew(found) => {
                return Err(PgFail::fixed(format!(
                "schema version {found} is newer than this build knows ({}); upgrade promptforge",
                schema::SCHEMA_VERSION
            )))
            }
        }
    }
    Ok(client)
}

/// Run `op` with a connection, trying again with a new one while the
/// failure is transient, for at most `bound`.
pub(crate) async fn with_retry<T, F>(inner: Arc<Inner>, bound: Duration, op: F) -> Result<T, PgFail>
where
    F: Fn(deadpool_postgres::Object) -> runtime::BoxFuture<Result<T, PgFail>>,
{
    let deadline = tokio::time::Instant::now() + bound;
    let mut pause = Duration::from_millis(50);
    loop {
        let tried = match client(&inner).await {
            Ok(client) => op(client).await,
            Err(fail) => Err(fail),
        };
        match tried {
            Err(fail) if fail.transient && tokio::time::Instant::now() + pause < deadline => {
                tracing::debug!(
                    "run log {}: {}; trying again",
                    inner.location.shown(),
                    fail.detail
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}
