//! The crate's own runtime: every call to the server is spawned here and
//! waited for on the caller's thread, which may be the writer's thread, a
//! command's main thread, or a thread inside another runtime (where
//! `block_on` would panic).

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("pf-runlog-pg")
                .enable_all()
                .build()
                .map_err(|err| format!("cannot start the PostgreSQL client's runtime: {err}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Run `future` on the crate's runtime and wait for its output.
pub(crate) fn block<T: Send + 'static>(
    future: impl Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    let runtime = runtime()?;
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = sender.send(future.await);
    });
    receiver
        .recv()
        .map_err(|_| "the PostgreSQL client's task ended without an answer".to_owned())
}
