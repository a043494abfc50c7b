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
pub mod mcp_server;
pub mod progress;
pub mod report;
pub mod signals;
pub mod trace;
pub mod ui;
pub mod usertest;

/// The run failed, or `check` found a problem.
/// The most any input the CLI reads whole may hold (a prompt file, ARGS from
/// stdin, a host file), so `/dev/zero` or an endless pipe cannot grow without bound.
pub const MAX_INPUT_BYTES: u64 = 16 * 1024 * 1024;

/// All of `reader`, or `Ok(None)` when it holds more than [`MAX_INPUT_BYTES`].
pub fn read_capped(reader: impl std::io::Read) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    reader.take(MAX_INPUT_BYTES + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= MAX_INPUT_BYTES).then_some(bytes))
}

pub const EXIT_FAILED: u8 = 1;
/// The command line, the host file or the environment was unusable.
pub const EXIT_USAGE: u8 = 2;
/// The run was cancelled (as a shell reports SIGINT).
pub const EXIT_CANCELLED: u8 = 130;

/// Dependencies whose own logs are noise to a prompt author: kept at `warn`
/// unless `PROMPTFORGE_LOG` names them or asks for `trace`.
const NOISY_TARGETS: &[&str] = &[
    "html5ever",
    "markup5ever",
    "html2text",
    "selectors",
    "hyper",
    "hyper_util",
    "reqwest",
    "rustls",
    "h2",
    "tower",
];

/// Diagnostics go to stderr, filtered by `PROMPTFORGE_LOG` (default `warn`).
pub fn init_logging() {
    init_logging_with_default("warn");
}

/// [`init_logging`] with another default level (`--quiet` uses `error`).
pub fn init_logging_with_default(default_level: &str) {
    let spec = std::env::var("PROMPTFORGE_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| default_level.to_string());
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(&spec))
        // Log lines go above the progress spinner, never onto its line.
        .with_writer(|| progress::AboveSpinner)
        .with_target(false)
        // Colour only on a terminal, never under NO_COLOR or `--color never`
        // (read before logging starts).
        .with_ansi(crate::ui::stderr_color())
        .init();
}

/// The filter for a `PROMPTFORGE_LOG` spec, with dependency noise turned down.
pub fn log_filter(spec: &str) -> tracing_subscriber::EnvFilter {
    let mut filter = tracing_subscriber::EnvFilter::try_new(spec)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // The run log's own warning reaches stderr once, as a `warning:` line
    // (`host::data::begin_run_log`), so its tracing copy stays quiet by default.
    if !spec.contains("pf_runlog") {
        if let Ok(directive) = "pf_runlog=error".parse() {
            filter = filter.add_directive(directive);
        }
    }
    if !spec.contains("trace") {
        for target in NOISY_TARGETS {
            if spec.contains(target) {
                continue;
            }
            if let Ok(directive) = format!("{target}=warn").parse() {
                filter = filter.add_directive(directive);
            }
        }
    }
    filter
}
