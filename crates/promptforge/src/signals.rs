//! Signals: SIGINT (Ctrl-C), SIGTERM and SIGHUP each cancel the run; a second
//! one exits at once, still printing the cancelled report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use pf_harness::CancellationToken;

/// Whether the run's report has been printed (by the run, or by a second signal).
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Take the one right to print the run's report: `true` for the first caller
/// only, so a second signal and a finishing run never both print.
pub fn claim_report() -> bool {
    !REPORTED.swap(true, Ordering::SeqCst)
}

type ExitHook = Box<dyn Fn() + Send + Sync>;

static BEFORE_FORCED_EXIT: OnceLock<ExitHook> = OnceLock::new();

/// What to do before a second signal ends the process (the run log records
/// the run's end). Only the first hook set counts.
pub fn before_forced_exit(hook: impl Fn() + Send + Sync + 'static) {
    let _ = BEFORE_FORCED_EXIT.set(Box::new(hook));
}

/// SIGINT, SIGTERM and SIGHUP cancel the run (the engine then stops every
/// Plugin, MCP servers included, and the run reports `cancelled`). A second
/// signal kills every MCP server's process group, calls `print_cancelled`
/// (unless the run's own report is out) and exits with 130 at once. The
/// watcher has a thread of its own because the run's thread may be busy
/// inside Lua; the engine polls the token from an instruction hook.
///
/// The handlers are installed before this returns, on the calling thread:
/// installed on the watcher's thread, a signal that came before that thread
/// got to it (a busy machine, a Ctrl-C at once) still had its default
/// action and killed the process with no report and no logged end.
pub fn watch_signals(cancel: CancellationToken, print_cancelled: Box<dyn FnOnce() + Send>) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        tracing::warn!("signals will not cancel the run: no runtime for the watcher");
        return;
    };
    // Registering needs the runtime's signal driver; the OS handler is in
    // place from here on, and the watcher's thread drives the runtime.
    let registered = {
        let _in_runtime = rt.enter();
        Signals::register()
    };
    let Some(mut signals) = registered else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(async {
                signals.next().await;
                cancel.cancel();
                signals.next().await;
                if let Some(hook) = BEFORE_FORCED_EXIT.get() {
                    hook();
                }
                // No destructor runs on this way out: stop the MCP servers here.
                pf_plugins::kill_live_mcp_servers();
                pf_models::kill_spawned_servers();
                if claim_report() {
                    print_cancelled();
                }
                std::process::exit(i32::from(crate::EXIT_CANCELLED));
            });
        });
    if let Err(e) = spawned {
        tracing::warn!("signals will not cancel the run: {e}");
    }
}

/// The three signals that stop a run, registered before the run starts.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn register() -> Option<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("{name} will not cancel the run: {e}");
                None
            }
        };
        Some(Signals {
            interrupt: listen(SignalKind::interrupt(), "SIGINT")?,
            terminate: listen(SignalKind::terminate(), "SIGTERM")?,
            hangup: listen(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// Wait for the next of the three.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
            _ = self.hangup.recv() => {}
        }
    }
}
