//! The promptforge Host: the command line, the host file, the run report, exit
//! codes and Ctrl-C, as a library so the binary stays a thin dispatcher and
//! other commands (and tests) reuse the same pieces.
//!
//! Architecture invariant: only this crate knows the host file, the command
//! line, the process exit codes and the JSON report.

pub mod cli;
pub mod commands;
pub mod live;
pub mod progress;
pub mod signals;
pub mod ui;
pub mod usertest;
pub mod watch;

pub use pf_host::{read_capped, MAX_INPUT_BYTES};

pub use pf_host::error::{EXIT_FAILED, EXIT_USAGE};
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
        // Every line is scrubbed of the keys the host file names (a debug
        // line may quote a server's words), and goes above the progress
        // spinner, never onto its line.
        .with_writer(ScrubbedStderr)
        .with_target(false)
        // Colour only on a terminal, never under NO_COLOR or `--color never`
        // (read before logging starts).
        .with_ansi(crate::ui::stderr_color())
        .init();
}

/// stderr for log lines, each scrubbed of every registered key
/// ([`pf_secrets::global`]). The formatter hands over one whole line per write.
struct ScrubbedStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ScrubbedStderr {
    type Writer = ScrubbedLine;

    fn make_writer(&'a self) -> ScrubbedLine {
        ScrubbedLine(Vec::new())
    }
}

/// One log line, written to stderr scrubbed when dropped (above the spinner).
struct ScrubbedLine(Vec<u8>);

impl std::io::Write for ScrubbedLine {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ScrubbedLine {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.0);
        let line = pf_secrets::global().scrub(&text);
        let _ = std::io::Write::write_all(&mut progress::AboveSpinner, line.as_bytes());
    }
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
    // rmcp's own errors name its Rust types; every one that matters is
    // restated by the Plugin or the server in a line of its own.
    if !spec.contains("rmcp") {
        if let Ok(directive) = "rmcp=off".parse() {
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
