//! `promptforge test [PATH...]`: find the test files, run their cases in
//! parallel, print a line per case and `N passed, N failed` (or one JSON
//! object), optionally JUnit XML; exit 1 on any failure, 2 on a malformed
//! test file or a bad command line.

use std::process::ExitCode;

use pf_host::HostError;
use std::sync::Arc;

use crate::cli::{OutputFormat, TestArgs};
use crate::usertest::fixtures::{ScratchPool, WorkDir};
use crate::usertest::{self, matrix, run::Settings, CaseOutcome, Options};

/// The stdio MCP server behind `mcp:` fixtures, shipped inside the binary.
const MCP_FIXTURE: &str = include_str!("../../tests/fixtures/mcp_fixture.py");

pub fn run(args: TestArgs) -> Result<ExitCode, HostError> {
    if args.watch {
        return crate::watch::rerun_on_change(|| crate::watch::test_inputs(&args));
    }
    if args.update && (!args.model.is_empty() || !args.prompt.is_empty() || args.repeat > 1) {
        return Err(HostError::Usage(
            "--update writes scripted results; it takes neither --model, --prompt nor --repeat"
                .to_string(),
        ));
    }
    if !(0.0..=1.0).contains(&args.pass_rate) {
        return Err(HostError::Usage(
            "--pass-rate is a share of runs, from 0 to 1".to_string(),
        ));
    }
    if let Some(twice) = given_twice(args.model.iter().map(String::as_str)) {
        return Err(HostError::Usage(format!("--model {twice} is given twice")));
    }
    if let Some(twice) = given_twice(args.prompt.iter().map(|p| p.to_str().unwrap_or(""))) {
        return Err(HostError::Usage(format!("--prompt {twice} is given twice")));
    }
    let format = args.output.format();
    let files = usertest::discover(&args.paths).map_err(HostError::Usage)?;
    if files.is_empty() {
        let paths: Vec<String> = args.paths.iter().map(|p| usertest::shown(p)).collect();
        return Err(HostError::Usage(format!(
            "no test files (NAME.test.yaml, tests/*.yaml) under {}",
            paths.join(" ")
        )));
    }
    let loaded = usertest::load_all(&files)
        .map_err(|bad| HostError::Inputs(bad.iter().map(ToString::to_string).collect()))?;
    let host = args.host.path();
    let variants = match matrix::variants(&args, host.as_deref(), &loaded) {
        Ok(v) => v,
        Err(m) => return Err(HostError::Usage(m)),
    };
    let matrix = variants.len() > 1;
    let scratch = match WorkDir::new() {
        Ok(w) => w,
        Err(e) => return Err(HostError::Usage(e)),
    };
    let fixture = scratch.0.join("mcp_fixture.py");
    if let Err(e) = std::fs::write(&fixture, MCP_FIXTURE) {
        return Err(HostError::Usage(format!(
            "cannot write {}: {e}",
            fixture.display()
        )));
    }
    // A comparison's cells are logged runs: each can be shown, replayed and
    // traced, and `--cache` answers from them.
    let log =
        !args.model.is_empty() || !args.prompt.is_empty() || args.cache || args.html.is_some();
    let batch = log.then(|| format!("test-{:016x}", rand::random::<u64>()));
    // Where the cells' runs are logged (as every run: the environment's,
    // the host file's `[runlog]`, or the data directory), read back there.
    let run_log = pf_host::session::RunSettings::run_log_at(host.as_deref())?;
    let cache = if args.cache {
        match matrix::cache(&run_log, &loaded, &variants) {
            Ok(c) => Some(Arc::new(c)),
            Err(m) => return Err(HostError::Usage(m)),
        }
    } else {
        None
    };
    let settings = Settings {
        mcp_fixture: fixture,
        python: "python3".to_string(),
        host,
        log,
        run_log: run_log.clone(),
        batch: batch.clone(),
        cache,
        scratch: ScratchPool::new(scratch.0.clone()),
    };
    let options = Options {
        filter: args.filter.clone(),
        update: args.update,
        repeat: args.repeat,
        pass_rate: args.pass_rate,
        jobs: args.jobs.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
            if args.model.is_empty() {
                cores
            } else {
                cores.max(LIVE_JOBS)
            }
        }),
        variants: variants.clone(),
        cancel: pf_harness::CancellationToken::new(),
    };
    if log {
        // Logged runs end as cancelled on a signal, and the cells that ran
        // are still reported; scripted runs keep the default (exit at once).
        crate::signals::watch_signals(
            options.cancel.clone(),
            Box::new(|| {
                eprintln!("test: stopped at once; runs in flight may stay `running` in the log")
            }),
        );
    }
    let human = format == OutputFormat::Human;
    let (mut outcomes, updated) = usertest::run_all(&settings, &loaded, &options, |o| {
        if human {
            let mut text = format!("{}\n", line(o, matrix));
            if !o.passed {
                for l in o.details().lines() {
                    text.push_str(&format!("    {l}\n"));
                }
            }
            crate::ui::print_stdout(&crate::ui::stdout_text(&text));
        }
    });
    if let Some(batch) = &batch {
        matrix::find_logged(&run_log, batch, &mut outcomes);
    }
    let passed = outcomes.iter().filter(|o| o.passed).count();
    let failed = outcomes.len() - passed;
    if let Some(path) = &args.junit {
        std::fs::write(path, usertest::junit::render(&outcomes))
            .map_err(|e| HostError::Usage(format!("cannot write {}: {e}", path.display())))?;
    }
    let labels: Vec<String> = variants.iter().map(|v| v.label.clone()).collect();
    let totals = matrix::totals(&outcomes, labels.len());
    if let Some(path) = &args.html {
        let title = args
            .paths
            .iter()
            .map(|p| usertest::shown(p))
            .collect::<Vec<_>>()
            .join(" ");
        match usertest::html::write(&run_log, path, &title, &labels, &outcomes, &totals) {
            Ok(()) => {
                if args.open {
                    super::page::open_in_browser(
                        &std::path::absolute(path).unwrap_or(path.clone()),
                    );
                }
            }
            Err(e) => return Err(HostError::Failed(e.to_string())),
        }
    }
    for file in &updated {
        eprintln!("updated {file}");
    }
    if let Some(batch) = &batch {
        eprintln!("runs logged as {batch} (promptforge runs --batch {batch})");
    }
    if human {
        if matrix {
            let table = matrix::table(&outcomes, &labels, &totals);
            crate::ui::print_stdout(&crate::ui::stdout_text(&table));
        }
        if let Some(note) = matrix::cache_note(&totals) {
            crate::ui::print_stdout(&format!("{note}\n"));
        }
        crate::ui::print_stdout(&format!("{passed} passed, {failed} failed\n"));
    } else {
        let mut report = serde_json::json!({
            "passed": passed,
            "failed": failed,
            "updated": updated,
            "cases": outcomes,
        });
        if log || matrix {
            report["matrix"] = serde_json::json!({
                "batch": batch,
                "columns": labels,
                "totals": totals,
            });
        }
        crate::ui::print_stdout(&format!("{report}\n"));
    }
    Ok(if options.cancel.is_cancelled() {
        ExitCode::from(crate::EXIT_CANCELLED)
    } else if failed > 0 {
        ExitCode::from(crate::EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs at once by default when cases run against live models: they wait on
/// the servers, not the CPU, and each model's `concurrency` still holds.
const LIVE_JOBS: usize = 16;

/// The first value given twice.
fn given_twice<'a>(values: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = std::collections::BTreeSet::new();
    values.into_iter().find(|v| !seen.insert(*v))
}

/// `ok     FILE: NAME [COLUMN] (TIME)`, with the pass rate when the case ran
/// more than once; the column only in a matrix.
fn line(o: &CaseOutcome, matrix: bool) -> String {
    let status = if o.passed { "ok    " } else { "FAILED" };
    let time = format!("{:.2}s", o.duration_ms as f64 / 1000.0);
    let mut tags = String::new();
    if o.updated {
        tags.push_str(" [updated]");
    }
    if o.cell.as_ref().is_some_and(|c| c.cached) {
        tags.push_str(" [cached]");
    }
    let column = match (&o.cell, matrix) {
        (Some(cell), true) => format!(" [{}]", cell.column),
        _ => String::new(),
    };
    if o.runs > 1 {
        format!(
            "{status} {}: {}{column} ({}/{} passed, {:.0}%, {time}){tags}",
            o.file,
            o.name,
            o.passes,
            o.runs,
            o.pass_rate * 100.0
        )
    } else {
        format!("{status} {}: {}{column} ({time}){tags}", o.file, o.name)
    }
}
