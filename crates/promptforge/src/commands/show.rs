//! `promptforge show RUN`: one logged run, a summary then its timeline
//! (text), or the run with its events and host work (`--json`).
//!
//! Exit status: 0 shown, 2 when RUN names no logged run or several (the
//! message lists candidates), 1 when the log cannot be read.

use std::io::Write;
use std::process::ExitCode;

use pf_runlog::{Outcome, RunLogError};
use serde_json::{json, Value as Json};

use crate::cli::{OutputFormat, ShowArgs};
use pf_trace::logview::{duration_text, printable, short, timeline, when_rfc3339, when_text};
pub use pf_trace::{load, LoggedRun};

pub fn run(args: ShowArgs) -> ExitCode {
    let log = match super::open_log(&args.host) {
        Ok(Some(log)) => log,
        Ok(None) => {
            return super::usage(&format!(
                "no logged run matches `{}`: no run has been logged yet",
                args.run
            ))
        }
        Err(m) => return super::usage(&m),
    };
    let logged = match load(&log, &args.run) {
        Ok(run) => run,
        Err(e @ (RunLogError::Unknown { .. } | RunLogError::Ambiguous { .. })) => {
            return super::usage(&resolve_message(&e))
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(crate::EXIT_FAILED);
        }
    };
    if args.page.wanted() {
        return super::page::show(&logged, &args.page);
    }
    let mut out = std::io::stdout().lock();
    let written = match args.output.format() {
        OutputFormat::Json => writeln!(out, "{}", run_json(&logged)),
        OutputFormat::Human => write_text(&mut out, &logged, args.all),
    };
    crate::ui::written(written)
}

/// An unknown or ambiguous RUN, with the candidates to pick from.
pub(crate) fn resolve_message(error: &RunLogError) -> String {
    match error {
        RunLogError::Unknown { recent, .. } if recent.is_empty() => format!("{error}"),
        RunLogError::Unknown { recent, .. } => {
            format!("{error}; the newest runs: {}", recent.join(", "))
        }
        RunLogError::Ambiguous { candidates, .. } => format!(
            "{error}: {}; give more of the execution id",
            candidates.join(", ")
        ),
        other => other.to_string(),
    }
}

/// The run as `show --json` gives it: the summary fields, the guide's event
/// objects, and the host work.
pub fn run_json(run: &LoggedRun) -> Json {
    let r = &run.record;
    let execution = &r.start.execution;
    let mut out = serde_json::Map::new();
    let mut put = |key: &str, value: Json| {
        out.insert(key.to_string(), value);
    };
    put("id", json!(r.id.0));
    put("execution", json!(execution));
    put("outcome", json!(r.outcome_label()));
    match r.end.as_ref().map(|e| &e.outcome) {
        Some(Outcome::Completed { result }) => put("result", json!(result)),
        Some(Outcome::Failed { kind, message }) => {
            put("error", json!({"kind": kind, "message": message}))
        }
        _ => {}
    }
    put("prompt", json!(r.start.prompt_path));
    put("prompt_sha256", json!(r.prompt_sha256));
    put("prompt_text", json!(r.start.prompt_text));
    put("args", r.start.args.clone());
    put("seed", json!(r.start.seed));
    put("start", json!(r.start.start_rfc3339));
    put("started", json!(when_rfc3339(r.started_at_ms)));
    put("finished", json!(r.finished_at_ms.map(when_rfc3339)));
    put("host_file", json!(r.start.host_file));
    put("model", json!(r.start.model));
    put("store", json!(r.start.store_dir));
    put("replay_of", json!(r.start.replay_of));
    put("resumed_from", json!(r.start.resumed_from));
    put("duration_ms", json!(r.end.as_ref().map(|e| e.duration_ms)));
    put(
        "tokens",
        json!(r.end.as_ref().map(|e| json!({
            "input": e.usage.input, "output": e.usage.output, "total": e.usage.total
        }))),
    );
    put(
        "events",
        Json::Array(run.events.iter().map(|e| e.to_json(execution)).collect()),
    );
    put("exchanges", json!(run.exchanges));
    put("tool_calls", json!(run.tool_calls));
    put("answers", json!(run.answers));
    Json::Object(out)
}

fn write_text(out: &mut impl Write, run: &LoggedRun, all: bool) -> std::io::Result<()> {
    let r = &run.record;
    writeln!(
        out,
        "{} ({})  {}",
        r.start.execution,
        r.id,
        r.outcome_label()
    )?;
    let mut field = |name: &str, value: &str| writeln!(out, "  {name:<9} {}", printable(value));
    field(
        "prompt",
        &format!(
            "{} (sha256 {})",
            r.start.prompt_path,
            short(&r.prompt_sha256, 12)
        ),
    )?;
    let args = match &r.start.args {
        Json::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    field("args", &short(&args, 100))?;
    field("seed", &r.start.seed.to_string())?;
    field("start", &r.start.start_rfc3339)?;
    field("started", &format!("{} UTC", when_text(r.started_at_ms)))?;
    field("model", r.start.model.as_deref().unwrap_or("(none)"))?;
    if let Some(original) = &r.start.replay_of {
        field("replay of", original)?;
    }
    if let Some(original) = &r.start.resumed_from {
        field("resumes", original)?;
    }
    if let Some(host) = &r.start.host_file {
        field("host", host)?;
    }
    if let Some(store) = &r.start.store_dir {
        field("store", store)?;
    }
    match &r.end {
        None => field("outcome", "running (no end logged: still going, or killed)")?,
        Some(end) => {
            match &end.outcome {
                Outcome::Completed { result } => field("result", &short(result, 200))?,
                Outcome::Failed { kind, message } => {
                    field("error", &format!("{kind}: {}", short(message, 200)))?
                }
                Outcome::Cancelled => field("outcome", "cancelled")?,
            }
            field("duration", &duration_text(end.duration_ms))?;
            field(
                "tokens",
                &format!(
                    "{} in / {} out / {} total",
                    end.usage.input, end.usage.output, end.usage.total
                ),
            )?;
        }
    }
    let lines = timeline(
        &run.events,
        &run.exchanges,
        &run.tool_calls,
        &run.answers,
        all,
    );
    writeln!(out)?;
    writeln!(out, "timeline ({} events)", run.events.len())?;
    let width = lines
        .iter()
        .map(|l| l.section.chars().count())
        .max()
        .unwrap_or(0)
        .min(24);
    for line in lines {
        let place = format!("{}#{}", line.task, line.seq);
        writeln!(
            out,
            "  {place:<8} {:<width$}  {}",
            printable(&short(&line.section, 24)),
            line.text
        )?;
    }
    Ok(())
}
