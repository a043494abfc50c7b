//! `promptforge test [PATH...]`: find the test files, run their cases in
//! parallel, print a line per case and `N passed, N failed` (or one JSON
//! object), optionally JUnit XML; exit 1 on any failure, 2 on a malformed
//! test file or a bad command line.

use std::io::Write;
use std::process::ExitCode;

use pf_host::HostError;

use crate::cli::{OutputFormat, TestArgs};
use crate::usertest::fixtures::WorkDir;
use crate::usertest::{self, catalog, run::Settings, CaseOutcome, Options};

/// The stdio MCP server behind `mcp:` fixtures, shipped inside the binary.
const MCP_FIXTURE: &str = include_str!("../../tests/fixtures/mcp_fixture.py");

pub fn run(args: TestArgs) -> Result<ExitCode, HostError> {
    if args.watch {
        return crate::watch::rerun_on_change(|| crate::watch::test_inputs(&args));
    }
    if args.update && (args.model.is_some() || args.repeat > 1) {
        return Err(HostError::Usage(
            "--update writes scripted results; it takes neither --model nor --repeat".to_string(),
        ));
    }
    if !(0.0..=1.0).contains(&args.pass_rate) {
        return Err(HostError::Usage(
            "--pass-rate is a share of runs, from 0 to 1".to_string(),
        ));
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
    let live = match &args.model {
        Some(id) => match catalog::lookup(host.as_deref(), id) {
            Ok(m) => Some(m),
            Err(e) => return Err(HostError::Usage(e)),
        },
        None => None,
    };
    let scratch = WorkDir::new().map_err(HostError::Usage)?;
    let fixture = scratch.0.join("mcp_fixture.py");
    if let Err(e) = std::fs::write(&fixture, MCP_FIXTURE) {
        return Err(HostError::Usage(format!(
            "cannot write {}: {e}",
            fixture.display()
        )));
    }
    let settings = Settings {
        mcp_fixture: fixture,
        python: "python3".to_string(),
        host,
        live,
    };
    let options = Options {
        filter: args.filter.clone(),
        update: args.update,
        repeat: args.repeat,
        pass_rate: args.pass_rate,
        jobs: args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
        }),
    };
    let human = format == OutputFormat::Human;
    let (outcomes, updated) = usertest::run_all(&settings, &loaded, &options, |o| {
        if human {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", line(o));
            if !o.passed {
                for l in o.details().lines() {
                    let _ = writeln!(out, "    {l}");
                }
            }
        }
    });
    let passed = outcomes.iter().filter(|o| o.passed).count();
    let failed = outcomes.len() - passed;
    if let Some(path) = &args.junit {
        std::fs::write(path, usertest::junit::render(&outcomes))
            .map_err(|e| HostError::Usage(format!("cannot write {}: {e}", path.display())))?;
    }
    for file in &updated {
        eprintln!("updated {file}");
    }
    if human {
        crate::ui::print_stdout(&format!("{passed} passed, {failed} failed\n"));
    } else {
        let report = serde_json::json!({
            "passed": passed,
            "failed": failed,
            "updated": updated,
            "cases": outcomes,
        });
        crate::ui::print_stdout(&format!("{report}\n"));
    }
    Ok(if failed > 0 {
        ExitCode::from(crate::EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

/// `ok     FILE: NAME (TIME)`, with the pass rate when the case ran more than once.
fn line(o: &CaseOutcome) -> String {
    let status = if o.passed { "ok    " } else { "FAILED" };
    let time = format!("{:.2}s", o.duration_ms as f64 / 1000.0);
    let updated = if o.updated { " [updated]" } else { "" };
    if o.runs > 1 {
        format!(
            "{status} {}: {} ({}/{} passed, {:.0}%, {time}){updated}",
            o.file,
            o.name,
            o.passes,
            o.runs,
            o.pass_rate * 100.0
        )
    } else {
        format!("{status} {}: {} ({time}){updated}", o.file, o.name)
    }
}
