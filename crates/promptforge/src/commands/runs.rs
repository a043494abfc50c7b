//! `promptforge runs`: the run log, newest first.

use std::io::Write;
use std::process::ExitCode;

use pf_runlog::{RunFilter, RunSummary};
use serde_json::{json, Value as Json};

use crate::cli::{OutputFormat, RunsArgs};
use pf_trace::logview::{duration_text, printable, short, when_rfc3339, when_text};

pub fn run(args: RunsArgs) -> ExitCode {
    let log = match pf_host::data::open_run_log() {
        Ok(log) => log,
        Err(m) => return super::usage(&m),
    };
    let filter = RunFilter {
        limit: Some(args.limit),
        prompt: args.prompt.clone(),
        outcome: args.outcome.map(|o| o.label().to_string()),
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
