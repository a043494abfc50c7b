//! `promptforge test [PATH...]`: find the test files, run their cases in
//! parallel, print a line per case and `N passed, N failed` (or one JSON
//! object), optionally JUnit XML; exit 1 on any failure, 2 on a malformed
//! test file or a bad command line.

use std::io::Write;
use std::process::ExitCode;

use crate::cli::{OutputFormat, TestArgs};
use crate::usertest::fixtures::WorkDir;
use crate::usertest::{self, catalog, run::Settings, CaseOutcome, Options};

/// The stdio MCP server behind `mcp:` fixtures, shipped inside the binary.
const MCP_FIXTURE: &str = include_str!("../../tests/fixtures/mcp_fixture.py");

pub fn run(args: TestArgs) -> ExitCode {
    if args.update && (args.model.is_some() || args.repeat > 1) {
        return super::usage(
            "--update writes scripted results; it takes neither --model nor --repeat",
        );
    }
    if !(0.0..=1.0).contains(&args.pass_rate) {
        return super::usage("--pass-rate is a share of runs, from 0 to 1");
    }
    let format = args.output.format();
    let files = match usertest::discover(&args.paths) {
        Ok(f) => f,
        Err(m) => return super::usage(&m),
    };
    if files.is_empty() {
        let paths: Vec<String> = args.paths.iter().map(|p| usertest::shown(p)).collect();
        return super::usage(&format!(
            "no test files (NAME.test.yaml, tests/*.yaml) under {}",
            paths.join(" ")
        ));
    }
    let loaded = match usertest::load_all(&files) {
        Ok(l) => l,
        Err(bad) => {
            for m in bad {
                eprintln!("error: {m}");
            }
            return ExitCode::from(crate::EXIT_USAGE);
        }
    };
    let host = args.host.path();
    let live = match &args.model {
        Some(id) => match catalog::lookup(host.as_deref(), id) {
            Ok(m) => Some(m),
            Err(e) => return super::usage(&e),
        },
        None => None,
    };
    let scratch = match WorkDir::new() {
        Ok(w) => w,
        Err(e) => return super::usage(&e),
    };
    let fixture = scratch.0.join("mcp_fixture.py");
    if let Err(e) = std::fs::write(&fixture, MCP_FIXTURE) {
        return super::usage(&format!("cannot write {}: {e}", fixture.display()));
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
        if let Err(e) = std::fs::write(path, usertest::junit::render(&outcomes)) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return ExitCode::from(crate::EXIT_USAGE);
        }
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
    if failed > 0 {
        ExitCode::from(crate::EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
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
