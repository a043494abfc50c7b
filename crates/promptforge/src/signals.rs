//! Signals: Ctrl-C cancels the run.

use std::sync::OnceLock;

use pf_harness::CancellationToken;

type ExitHook = Box<dyn Fn() + Send + Sync>;

static BEFORE_FORCED_EXIT: OnceLock<ExitHook> = OnceLock::new();

/// What to do before a second Ctrl-C ends the process (the run log records
/// the run's end). Only the first hook set counts.
pub fn before_forced_exit(hook: impl Fn() + Send + Sync + 'static) {
    let _ = BEFORE_FORCED_EXIT.set(Box::new(hook));
}

/// Ctrl-C cancels the run. The watcher has a thread of its own because the run's
/// thread may be busy inside Lua; the engine polls the token from an instruction hook.
pub fn watch_ctrl_c(cancel: CancellationToken) {
    let spawned = std::thread::Builder::new()
        .name("ctrl-c".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if tokio::signal::ctrl_c().await.is_ok() {
                    cancel.cancel();
                    // A second Ctrl-C stops at once.
                    if tokio::signal::ctrl_c().await.is_ok() {
                        if let Some(hook) = BEFORE_FORCED_EXIT.get() {
                            hook();
                        }
                        std::process::exit(i32::from(crate::EXIT_CANCELLED));
                    }
                }
            });
        });
    if let Err(e) = spawned {
        tracing::warn!("Ctrl-C will not cancel the run: {e}");
    }
}
