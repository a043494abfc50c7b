//! The `promptforge` CLI: the Host.
//!
//! Architecture invariant: only this crate knows the host file, the command line,
//! the process exit codes and the JSON report.

mod host;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Parser, Subcommand};
use pf_engine::{LiveText, Outcome, RunEvent, RunObserver, RunSetup};
use pf_harness::CancellationToken;
use serde_json::json;

#[derive(Parser)]
#[command(name = "promptforge", version, about = "Runs promptforge prompt files")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a prompt; ARGS is the run's argument string.
    Run {
        file: PathBuf,
        args: Option<String>,
        /// Host file (TOML). Default: $PROMPTFORGE_HOST, else ~/.config/promptforge/host.toml.
        #[arg(long)]
        host: Option<PathBuf>,
        /// Run seed. Default: random.
        #[arg(long)]
        seed: Option<u64>,
        /// Run start instant (RFC 3339). Default: now.
        #[arg(long)]
        start: Option<String>,
        /// The run's store directory. Default: a fresh directory.
        #[arg(long)]
        store: Option<PathBuf>,
        /// Print the run report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Parse only; print each problem as FILE:LINE:COL: Kind: message.
    Check { file: PathBuf },
}

const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_CANCELLED: u8 = 130;

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PROMPTFORGE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Check { file } => check(&file),
        Command::Run {
            file,
            args,
            host,
            seed,
            start,
            store,
            json,
        } => run(
            &file,
            args.unwrap_or_default(),
            host,
            seed,
            start,
            store,
            json,
        ),
    }
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("error: {msg}");
    ExitCode::from(EXIT_USAGE)
}

fn read_prompt(file: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

fn check(file: &Path) -> ExitCode {
    let source = match read_prompt(file) {
        Ok(s) => s,
        Err(m) => return usage(&m),
    };
    match pf_syntax::parse(&source) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            println!(
                "{}:{}:{}: {}: {}",
                file.display(),
                e.line.unwrap_or(1),
                e.column.unwrap_or(1),
                e.kind.as_str(),
                e.message
            );
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn parse_start(text: &str) -> Result<i64, String> {
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("--start {text:?} is not an RFC 3339 instant: {e}"))?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn run(
    file: &Path,
    args: String,
    host_path: Option<PathBuf>,
    seed: Option<u64>,
    start: Option<String>,
    store: Option<PathBuf>,
    json_out: bool,
) -> ExitCode {
    let source = match read_prompt(file) {
        Ok(s) => s,
        Err(m) => return usage(&m),
    };
    let start_ms = match start.as_deref().map(parse_start).transpose() {
        Ok(v) => v.unwrap_or_else(now_ms),
        Err(m) => return usage(&m),
    };
    let seed = seed.unwrap_or_else(rand::random);
    let prompt = match pf_syntax::parse(&source) {
        Ok(p) => p,
        Err(e) => return parse_failure(file, &e, json_out),
    };
    // A file that is not a prompt fails like a parse error; an unsupported
    // major is the Engine's `Version` run error.
    if let Err(problem @ pf_syntax::VersionProblem::NotAPrompt) = pf_syntax::check_version(&prompt)
    {
        let e = pf_syntax::ParseError {
            kind: pf_syntax::ParseErrorKind::Structure,
            message: problem.message(),
            line: None,
            column: None,
        };
        return parse_failure(file, &e, json_out);
    }
    let host_path = host_path.or_else(host::default_host_path);
    let host_file = match host::load(host_path.as_deref()) {
        Ok(h) => h,
        Err(m) => return usage(&m),
    };
    let base_dir = host_path
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let (execution, _) = pf_engine::seeded_names(seed);
    let store_dir = store.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("promptforge-{execution}-{}", std::process::id()))
    });
    // A declared input file is read from the store. When the store lacks it, the
    // Host copies it in from beside the prompt file (the file the operator wrote
    // the prompt next to); otherwise a missing input is only a warning, because
    // the run never checks the declaration (guide ch. 02).
    if pf_engine::missing_input(&prompt, &store_dir).is_some() {
        if let Some(declared) = prompt.frontmatter.input.as_ref() {
            let beside = file.parent().unwrap_or(Path::new(".")).join(&declared.path);
            if beside.is_file() {
                if let Err(why) = pf_engine::place_input(&prompt, &store_dir, &beside) {
                    eprintln!("warning: {why}");
                }
            }
        }
    }
    if let Some(notice) = pf_engine::missing_input(&prompt, &store_dir) {
        eprintln!(
            "warning: {notice} (store directory {})",
            store_dir.display()
        );
    }
    let prompt = Arc::new(prompt);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return usage(&format!("cannot start the async runtime: {e}")),
    };
    let cancel = CancellationToken::new();
    watch_ctrl_c(cancel.clone());
    // Live output is for a person watching: never in a report, a pipe or a file.
    let printer = (!json_out && std::io::stderr().is_terminal())
        .then(|| Arc::new(Mutex::new(LivePrinter::default())));
    let observer = printer
        .as_ref()
        .map(|p| Arc::new(TerminalLive(Arc::clone(p))) as Arc<dyn RunObserver>);
    let report = runtime.block_on(async {
        let host = match host::build(&host_file, &base_dir) {
            Ok(h) => h,
            Err(m) => return Err(m),
        };
        let setup = RunSetup {
            seed,
            start_ms,
            args,
            store_dir: store_dir.clone(),
            harness: host.harness,
            model: host.model,
            cancel: cancel.clone(),
            ui: None,
            observer,
            capture: false,
        };
        Ok(pf_engine::run(Arc::clone(&prompt), setup).await)
    });
    let report = match report {
        Ok(r) => r,
        Err(m) => return usage(&m),
    };
    if let Some(printer) = &printer {
        let mut printer = printer.lock().unwrap_or_else(|p| p.into_inner());
        let _ = printer.finish(&mut std::io::stderr().lock());
    }
    let (mut value, code) = match &report.outcome {
        Outcome::Completed(text) => (
            json!({"outcome": "completed", "result": text, "seed": seed, "execution": report.execution, "store": store_dir}),
            ExitCode::SUCCESS,
        ),
        Outcome::Failed(e) => (
            json!({"outcome": "failed", "error": {"kind": e.kind.as_str(), "message": e.message}, "seed": seed, "execution": report.execution, "store": store_dir}),
            ExitCode::from(EXIT_FAILED),
        ),
        Outcome::Cancelled => (
            json!({"outcome": "cancelled", "seed": seed, "execution": report.execution, "store": store_dir}),
            ExitCode::from(EXIT_CANCELLED),
        ),
    };
    if matches!(report.outcome, Outcome::Completed(_)) {
        collect_output(&prompt, &store_dir, &mut value, json_out);
    }
    if json_out {
        println!("{value}");
    } else {
        match &report.outcome {
            Outcome::Completed(text) => println!("{text}"),
            Outcome::Failed(e) => eprintln!("error[{}]: {}", e.kind.as_str(), e.message),
            Outcome::Cancelled => eprintln!("cancelled"),
        }
    }
    code
}

/// After a completed run, the declared output file stays in the store directory:
/// the report names it (`"output"`), and a missing one is a warning, never a
/// failure, because the run never checks the declaration (guide ch. 02).
fn collect_output(
    prompt: &pf_syntax::Prompt,
    store_dir: &Path,
    report: &mut serde_json::Value,
    json_out: bool,
) {
    let Some(collected) = pf_engine::collect_output(prompt, store_dir) else {
        return;
    };
    let declared = prompt
        .frontmatter
        .output
        .as_ref()
        .map(|o| o.path.clone())
        .unwrap_or_default();
    report["output"] = match collected {
        Ok(output) => {
            if !json_out {
                match &output.file {
                    Some(file) => eprintln!("output file {}: {}", output.path, file.display()),
                    None => eprintln!(
                        "output file {} is in the store {}",
                        output.path,
                        store_dir.display()
                    ),
                }
            }
            match output.file {
                Some(file) => json!({"path": output.path, "file": file}),
                None => json!({"path": output.path}),
            }
        }
        Err(message) => {
            eprintln!("warning: {message}");
            json!({"path": declared, "error": message})
        }
    };
}

/// Shows live output: each `models.loop` round's text as it streams, under a
/// `[section, round N]` line whenever the round changes.
#[derive(Debug, Default)]
struct LivePrinter {
    /// The section and round whose text is showing.
    round: Option<(String, u32)>,
    at_line_start: bool,
}

impl LivePrinter {
    fn write(&mut self, out: &mut impl Write, text: LiveText<'_>) -> std::io::Result<()> {
        let round = (text.section.to_string(), text.turn);
        if self.round.as_ref() != Some(&round) {
            if self.round.is_some() && !self.at_line_start {
                writeln!(out)?;
            }
            writeln!(out, "[{}, round {}]", printable(text.section), text.turn)?;
            self.round = Some(round);
            self.at_line_start = true;
        }
        if !text.text.is_empty() {
            write!(out, "{}", printable(text.text))?;
            self.at_line_start = text.text.ends_with('\n');
        }
        out.flush()
    }

    /// End the live output on a line of its own, before the run's own output.
    fn finish(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.round.is_some() && !self.at_line_start {
            self.at_line_start = true;
            writeln!(out)?;
        }
        out.flush()
    }
}

/// Model text with control characters made harmless, so a reply cannot move the
/// cursor or rewrite the terminal; line breaks and tabs stay.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

/// The live output listener: writes to stderr and stops listening once stderr fails.
struct TerminalLive(Arc<Mutex<LivePrinter>>);

impl RunObserver for TerminalLive {
    fn event(&self, _: &str, _: &RunEvent) {}
    fn wants_live_text(&self) -> bool {
        true
    }
    fn live_text(&self, text: LiveText<'_>) -> bool {
        let mut printer = self.0.lock().unwrap_or_else(|p| p.into_inner());
        printer.write(&mut std::io::stderr().lock(), text).is_ok()
    }
}

/// Ctrl-C cancels the run. The watcher has a thread of its own because the run's
/// thread may be busy inside Lua; the engine polls the token from an instruction hook.
fn watch_ctrl_c(cancel: CancellationToken) {
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
                        std::process::exit(i32::from(EXIT_CANCELLED));
                    }
                }
            });
        });
    if let Err(e) = spawned {
        tracing::warn!("Ctrl-C will not cancel the run: {e}");
    }
}

fn parse_failure(file: &Path, e: &pf_syntax::ParseError, json_out: bool) -> ExitCode {
    if json_out {
        let mut err = json!({"kind": e.kind.as_str(), "phase": "parse", "message": e.message});
        if let Some(l) = e.line {
            err["line"] = json!(l);
        }
        if let Some(c) = e.column {
            err["column"] = json!(c);
        }
        println!("{}", json!({"outcome": "failed", "error": err}));
    } else {
        match (e.line, e.column) {
            (Some(l), Some(c)) => eprintln!(
                "{}:{l}:{c}: error[{}]: {}",
                file.display(),
                e.kind.as_str(),
                e.message
            ),
            _ => eprintln!(
                "{}: error[{}]: {}",
                file.display(),
                e.kind.as_str(),
                e.message
            ),
        }
    }
    ExitCode::from(EXIT_FAILED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(printer: &mut LivePrinter, out: &mut Vec<u8>, section: &str, turn: u32, text: &str) {
        let fragment = LiveText {
            section,
            turn,
            text,
        };
        printer.write(out, fragment).expect("write to memory");
    }

    #[test]
    fn each_round_gets_its_own_heading_and_the_output_ends_its_line() {
        let mut printer = LivePrinter::default();
        let mut out = Vec::new();
        show(&mut printer, &mut out, "Draft", 1, "Hel");
        show(&mut printer, &mut out, "Draft", 1, "lo");
        show(&mut printer, &mut out, "Draft", 2, "Again\n");
        show(&mut printer, &mut out, "Review", 3, "ok");
        printer.finish(&mut out).expect("finish");
        assert_eq!(
            String::from_utf8_lossy(&out),
            "[Draft, round 1]\nHello\n[Draft, round 2]\nAgain\n[Review, round 3]\nok\n"
        );
    }

    #[test]
    fn nothing_shown_means_nothing_to_finish() {
        let mut out = Vec::new();
        LivePrinter::default().finish(&mut out).expect("finish");
        assert!(out.is_empty());
    }

    #[test]
    fn control_characters_in_model_text_are_neutralized() {
        assert_eq!(printable("a\x1b[2Jb\r\tc\n"), "a\u{FFFD}[2Jb\u{FFFD}\tc\n");
    }

    #[test]
    fn a_failing_terminal_stops_the_listener() {
        struct Gone;
        impl Write for Gone {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let fragment = LiveText {
            section: "S",
            turn: 1,
            text: "x",
        };
        assert!(LivePrinter::default().write(&mut Gone, fragment).is_err());
    }
}
