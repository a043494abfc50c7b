//! `promptforge runs`: the run log, newest first.

use std::io::Write;
use std::process::ExitCode;

use pf_runlog::{PruneReport, PruneSelection, RunFilter, RunSummary};
use serde_json::{json, Value as Json};

use crate::cli::{OutputFormat, PruneArgs, RunsAction, RunsArgs};
use pf_trace::logview::{duration_text, printable, short, when_rfc3339, when_text};

pub fn run(args: RunsArgs) -> ExitCode {
    if let Some(RunsAction::Prune(prune_args)) = args.action {
        return prune(prune_args);
    }
    let log = match super::open_log(&args.host) {
        Ok(log) => log,
        Err(m) => return super::usage(&m),
    };
    let filter = RunFilter {
        limit: Some(args.limit),
        prompt: args.prompt.clone(),
        outcome: args.outcome.map(|o| o.label().to_string()),
        search: args.search.clone(),
        batch: args.batch.clone(),
    };
    let runs = match log.as_ref().map(|log| log.list_runs(&filter)) {
        None => Vec::new(),
        Some(Ok(runs)) => runs,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(crate::EXIT_FAILED);
        }
    };
    let mut out = std::io::stdout().lock();
    let written = match args.output.format() {
        OutputFormat::Json => writeln!(out, "{}", Json::Array(runs.iter().map(run_json).collect())),
        OutputFormat::Human if runs.is_empty() => {
            eprintln!("{}", nothing_listed(&args));
            Ok(())
        }
        OutputFormat::Human => write_table(&mut out, &runs),
    };
    crate::ui::written(written)
}

/// Why the list is empty: nothing logged, or nothing the filters let through.
fn nothing_listed(args: &RunsArgs) -> String {
    let mut filters = Vec::new();
    if let Some(prompt) = &args.prompt {
        filters.push(format!("--prompt {}", printable(prompt)));
    }
    if let Some(outcome) = args.outcome {
        filters.push(format!("--outcome {}", outcome.label()));
    }
    if filters.is_empty() {
        "no runs logged".to_string()
    } else {
        format!("no logged run matches {}", filters.join(" "))
    }
}

/// One run as `runs --json` gives it.
pub fn run_json(run: &RunSummary) -> Json {
    json!({
        "id": run.id.0,
        "execution": run.execution,
        "prompt": run.prompt_path,
        "outcome": run.outcome,
        "started": when_rfc3339(run.started_at_ms),
        "start": run.start_rfc3339,
        "model": run.model,
        "duration_ms": run.duration_ms,
        "tokens": run.usage.map(|u| json!({"input": u.input, "output": u.output, "total": u.total})),
        "replay_of": run.replay_of,
        "resumed_from": run.resumed_from,
        "batch": run.batch,
    })
}

fn write_table(out: &mut impl Write, runs: &[RunSummary]) -> std::io::Result<()> {
    let rows: Vec<[String; 8]> = runs
        .iter()
        .map(|run| {
            [
                run.id.to_string(),
                when_text(run.started_at_ms),
                run.execution.clone(),
                short(&printable(&prompt_name(&run.prompt_path)), 40),
                outcome_cell(run),
                run.duration_ms.map_or("-".into(), duration_text),
                run.usage.map_or("-".into(), |u| u.total.to_string()),
                run.batch.as_deref().map_or("-".into(), printable),
            ]
        })
        .collect();
    let header = [
        "#",
        "WHEN (UTC)",
        "EXECUTION",
        "PROMPT",
        "OUTCOME",
        "DURATION",
        "TOKENS",
        "BATCH",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 8]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            let right = matches!(i, 0 | 5 | 6);
            let pad = width.saturating_sub(cell.chars().count());
            if i > 0 {
                text.push_str("  ");
            }
            if right {
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
            } else {
                text.push_str(cell);
                if i + 1 < cells.len() {
                    text.push_str(&" ".repeat(pad));
                }
            }
        }
        text
    };
    writeln!(out, "{}", line(header))?;
    for row in &rows {
        writeln!(out, "{}", line(row.each_ref().map(String::as_str)))?;
    }
    Ok(())
}

/// The outcome, marked when the run replayed or resumed another.
fn outcome_cell(run: &RunSummary) -> String {
    if run.replay_of.is_some() {
        format!("{} (replay)", run.outcome)
    } else if run.resumed_from.is_some() {
        format!("{} (resume)", run.outcome)
    } else {
        run.outcome.clone()
    }
}

/// The prompt path relative to the working directory when it lies below it.
fn prompt_name(path: &str) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            std::path::Path::new(path)
                .strip_prefix(cwd)
                .ok()
                .map(|p| p.display().to_string())
        })
        .unwrap_or_else(|| path.to_string())
}

/// `runs prune`: delete finished runs (or, with `--dry-run`, say which would
/// go), then the default store directories of the runs deleted.
fn prune(args: PruneArgs) -> ExitCode {
    let log = match super::open_log(&args.host) {
        Ok(log) => log,
        Err(m) => return super::usage(&m),
    };
    let selection = match (args.older_than, args.keep) {
        (Some(age), _) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            let cutoff = now.saturating_sub(age.as_millis());
            PruneSelection::StartedBefore(i64::try_from(cutoff).unwrap_or(i64::MAX))
        }
        (None, Some(keep)) => PruneSelection::KeepNewest(keep),
        // clap's group makes one of the two required.
        (None, None) => return super::usage("runs prune needs --older-than DURATION or --keep N"),
    };
    let report = match log.map(|mut log| log.prune(selection, args.dry_run)) {
        None => PruneReport::default(),
        Some(Ok(report)) => report,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(crate::EXIT_FAILED);
        }
    };
    let stores_root = pf_host::prompt_files::data_dir().map(|d| d.join("stores"));
    let mut stores = Vec::new();
    for run in &report.runs {
        let Some(dir) = run.store_dir.as_deref().map(std::path::Path::new) else {
            continue;
        };
        // Only a default store: a directory directly under <data>/stores,
        // named for the run, and not a symlink. A --store directory is the
        // user's, whatever happened to it.
        let default = stores_root.as_deref().is_some_and(|root| {
            dir.parent() == Some(root)
                && dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{}-", run.execution)))
        });
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            continue;
        };
        if !default || !meta.is_dir() {
            continue;
        }
        let bytes = tree_bytes(dir);
        if !args.dry_run {
            if let Err(e) = std::fs::remove_dir_all(dir) {
                eprintln!("warning: cannot delete store {}: {e}", dir.display());
                continue;
            }
        }
        stores.push((run.execution.clone(), dir.display().to_string(), bytes));
    }
    let store_bytes: u64 = stores.iter().map(|s| s.2).sum();
    let mut out = std::io::stdout().lock();
    let written = match args.output.format() {
        OutputFormat::Json => writeln!(
            out,
            "{}",
            json!({
                "dry_run": args.dry_run,
                "runs": report.runs.iter().map(|r| json!({
                    "id": r.id.0,
                    "execution": r.execution,
                    "prompt": r.prompt_path,
                    "started": when_rfc3339(r.started_at_ms),
                })).collect::<Vec<_>>(),
                "rows": report.rows,
                "stores": stores.iter().map(|(execution, dir, bytes)| json!({
                    "execution": execution, "dir": dir, "bytes": bytes,
                })).collect::<Vec<_>>(),
                "store_bytes": store_bytes,
            })
        ),
        OutputFormat::Human => {
            let verb = if args.dry_run {
                "would delete"
            } else {
                "deleted"
            };
            let mut text = String::new();
            for r in &report.runs {
                text.push_str(&format!(
                    "  {}  {}  {}\n",
                    when_text(r.started_at_ms),
                    r.execution,
                    printable(&prompt_name(&r.prompt_path))
                ));
            }
            text.push_str(&format!(
                "{verb} {} run{} ({} row{}) and {} store director{} ({})\n",
                report.runs.len(),
                if report.runs.len() == 1 { "" } else { "s" },
                report.rows,
                if report.rows == 1 { "" } else { "s" },
                stores.len(),
                if stores.len() == 1 { "y" } else { "ies" },
                size_text(store_bytes),
            ));
            out.write_all(text.as_bytes())
        }
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(crate::EXIT_FAILED),
    }
}

/// The bytes of the regular files under `dir`, not following symlinks.
fn tree_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => tree_bytes(&entry.path()),
            Ok(meta) if meta.is_file() => meta.len(),
            _ => 0,
        })
        .sum()
}

fn size_text(bytes: u64) -> String {
    const KIB: u64 = 1024;
    match bytes {
        b if b < KIB => format!("{b} B"),
        b if b < KIB * KIB => format!("{:.1} KiB", b as f64 / KIB as f64),
        b => format!("{:.1} MiB", b as f64 / (KIB * KIB) as f64),
    }
}
