//! `promptforge run FILE [ARGS]`: run a prompt against the Host and report.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use pf_engine::{Outcome, RunSetup};
use pf_harness::CancellationToken;
use pf_syntax::Prompt;

use crate::cli::{OutputFormat, RunArgs};
use crate::host::HostConfig;
use crate::live::{LivePrinter, TerminalLive};
use crate::report::{ReportOutput, ReportUsage, RunReport};

pub fn run(args: RunArgs) -> ExitCode {
    let file = args.file.as_path();
    let format = args.output.format();
    let source = match super::read_prompt(file) {
        Ok(s) => s,
        Err(m) => return super::usage(&m),
    };
    let start_ms = match args.seed.start_ms() {
        Ok(v) => v,
        Err(m) => return super::usage(&m),
    };
    let seed = args.seed.seed_or_random();
    let prompt = match parse_prompt(&source) {
        Ok(p) => p,
        Err(e) => {
            RunReport::of_parse_failure(&e).print(format, file);
            return ExitCode::from(crate::EXIT_FAILED);
        }
    };
    let host_config = match HostConfig::load(args.host.path().as_deref()) {
        Ok(h) => h,
        Err(m) => return super::usage(&m),
    };
    let current = match host_config.current_id(args.model.chosen().as_deref()) {
        Ok(id) => id,
        Err(m) => return super::usage(&m),
    };
    let (execution, _) = pf_engine::seeded_names(seed);
    let store_dir = match args.store.store.clone() {
        Some(dir) => dir,
        None => match private_store_dir(&execution) {
            Ok(dir) => dir,
            Err(m) => return super::usage(&m),
        },
    };
    place_input(&prompt, file, &store_dir);
    let prompt = Arc::new(prompt);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return super::usage(&format!("cannot start the async runtime: {e}")),
    };
    let cancel = CancellationToken::new();
    let cancelled_report = RunReport::of_cancelled(seed, &execution, &store_dir);
    let report_file = file.to_path_buf();
    crate::signals::watch_signals(
        cancel.clone(),
        Box::new(move || cancelled_report.print(format, &report_file)),
    );
    // Live output is for a person watching: never in a report, a pipe or a file.
    let printer = (format == OutputFormat::Human && std::io::stderr().is_terminal())
        .then(|| Arc::new(Mutex::new(LivePrinter::default())));
    let observer = printer
        .as_ref()
        .map(|p| Arc::new(TerminalLive(Arc::clone(p))) as Arc<dyn pf_engine::RunObserver>);
    let mut usage = None;
    let finished = runtime.block_on(async {
        let host = host_config.assemble(current.as_deref())?;
        usage = Some(Arc::clone(&host.usage));
        let setup = RunSetup {
            seed,
            start_ms,
            args: args.args.clone().unwrap_or_default(),
            store_dir: store_dir.clone(),
            harness: host.harness,
            model: host.model,
            catalog: host.catalog,
            cancel: cancel.clone(),
            ui: host.ui,
            observer,
            capture: false,
        };
        Ok::<_, String>(pf_engine::run(Arc::clone(&prompt), setup).await)
    });
    let finished = match finished {
        Ok(r) => r,
        Err(m) => return super::usage(&m),
    };
    if let Some(printer) = &printer {
        let mut printer = printer.lock().unwrap_or_else(|p| p.into_inner());
        let _ = printer.finish(&mut std::io::stderr().lock());
    }
    let mut report = RunReport::of_run(seed, &finished, &store_dir);
    report.usage = usage
        .and_then(|u| u.totals())
        .map(|(input_tokens, output_tokens)| ReportUsage {
            input_tokens,
            output_tokens,
        });
    if matches!(finished.outcome, Outcome::Completed(_)) {
        report.output = collect_output(&prompt, &store_dir);
    }
    if crate::signals::claim_report() {
        report.print(format, file);
    }
    match finished.outcome {
        Outcome::Completed(_) => ExitCode::SUCCESS,
        Outcome::Failed(_) => ExitCode::from(crate::EXIT_FAILED),
        Outcome::Cancelled => ExitCode::from(crate::EXIT_CANCELLED),
    }
}

/// The data directory: `$PROMPTFORGE_HOME`, else `$XDG_DATA_HOME/promptforge`
/// (absolute only), else `~/.local/share/promptforge`.
fn data_dir() -> Option<PathBuf> {
    let set = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = set("PROMPTFORGE_HOME") {
        return Some(dir);
    }
    if let Some(dir) = set("XDG_DATA_HOME").filter(|d| d.is_absolute()) {
        return Some(dir.join("promptforge"));
    }
    set("HOME").map(|home| home.join(".local/share/promptforge"))
}

/// A fresh, private store directory for a run without `--store`, made like
/// `mkdtemp`: under `<data dir>/stores`, an unpredictable name, mode 0700, and
/// never one that already exists (nothing there is reused or followed).
fn private_store_dir(execution: &str) -> Result<PathBuf, String> {
    use rand::Rng;
    let parent = data_dir()
        .ok_or("no data directory for the default store: set PROMPTFORGE_HOME or pass --store")?
        .join("stores");
    let private = |recursive: bool| {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(recursive);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
    };
    private(true)
        .create(&parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let builder = private(false);
    let mut last = None;
    for _ in 0..8 {
        let tag: u64 = rand::rng().random();
        let dir = parent.join(format!("{execution}-{tag:016x}"));
        match builder.create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
    Err(format!(
        "cannot create a store directory under {}: {}",
        parent.display(),
        last.map_or_else(String::new, |e| e.to_string())
    ))
}

/// The prompt, or the parse error to report; a file without `promptforge:` in
/// its frontmatter is not a prompt.
fn parse_prompt(source: &[u8]) -> Result<Prompt, pf_syntax::ParseError> {
    let prompt = pf_syntax::parse(source)?;
    // An unsupported major is the Engine's `Version` run error, not a parse error.
    if let Err(problem @ pf_syntax::VersionProblem::NotAPrompt) = pf_syntax::check_version(&prompt)
    {
        return Err(pf_syntax::ParseError {
            kind: pf_syntax::ParseErrorKind::Structure,
            message: problem.message(),
            line: None,
            column: None,
        });
    }
    Ok(prompt)
}

/// A declared input file is read from the store. When the store lacks it, the
/// Host copies it in from beside the prompt file (the file the operator wrote
/// the prompt next to); otherwise a missing input is only a warning, because
/// the run never checks the declaration (guide ch. 02).
fn place_input(prompt: &Prompt, prompt_file: &Path, store_dir: &Path) {
    if pf_engine::missing_input(prompt, store_dir).is_some() {
        if let Some(declared) = prompt.frontmatter.input.as_ref() {
            let beside = prompt_file
                .parent()
                .unwrap_or(Path::new("."))
                .join(&declared.path);
            if beside.is_file() {
                if let Err(why) = pf_engine::place_input(prompt, store_dir, &beside) {
                    eprintln!("warning: {why}");
                }
            }
        }
    }
    if let Some(notice) = pf_engine::missing_input(prompt, store_dir) {
        eprintln!(
            "warning: {notice} (store directory {})",
            store_dir.display()
        );
    }
}

/// After a completed run, the declared output file stays in the store directory:
/// the report names it (`"output"`), and a missing one is a warning, never a
/// failure, because the run never checks the declaration (guide ch. 02).
fn collect_output(prompt: &Prompt, store_dir: &Path) -> Option<ReportOutput> {
    let collected = pf_engine::collect_output(prompt, store_dir)?;
    Some(match collected {
        Ok(output) => ReportOutput {
            path: output.path,
            file: output.file,
            error: None,
        },
        Err(message) => {
            eprintln!("warning: {message}");
            let declared = prompt
                .frontmatter
                .output
                .as_ref()
                .map(|o| o.path.clone())
                .unwrap_or_default();
            ReportOutput {
                path: declared,
                file: None,
                error: Some(message),
            }
        }
    })
}
