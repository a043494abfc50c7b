//! The promptforge Host: the command line, the host file, the run report, exit
//! codes and Ctrl-C, as a library so the binary stays a thin dispatcher and
//! other commands (and tests) reuse the same pieces.
//!
//! Architecture invariant: only this crate knows the host file, the command
//! line, the process exit codes and the JSON report.

pub mod cases;
pub mod cli;
pub mod commands;
pub mod host;
pub mod live;
pub mod logview;
pub mod report;
pub mod signals;
pub mod trace;

/// The run failed, or `check` found a problem.
pub const EXIT_FAILED: u8 = 1;
/// The command line, the host file or the environment was unusable.
pub const EXIT_USAGE: u8 = 2;
/// The run was cancelled (as a shell reports SIGINT).
pub const EXIT_CANCELLED: u8 = 130;

/// Diagnostics go to stderr, filtered by `PROMPTFORGE_LOG` (default `warn`).
pub fn init_logging() {
    // The run log's own warning reaches stderr once, as a `warning:` line
    // (`host::data::begin_run_log`), so its tracing copy stays quiet by default.
    let filter = tracing_subscriber::EnvFilter::try_from_env("PROMPTFORGE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,pf_runlog=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
