//! The CLI reference (docs/src/reference/cli.md), generated from the clap
//! definitions: every visible command, its usage, arguments and flags. A test
//! compares the checked-in page with [`cli_reference`], so the docs cannot
//! drift; `promptforge reference > docs/src/reference/cli.md` regenerates it.

use std::fmt::Write as _;
use std::process::ExitCode;

use pf_host::HostError;

use clap::{Arg, CommandFactory};

use crate::cli::Cli;

pub fn run() -> Result<ExitCode, HostError> {
    crate::ui::print_stdout(&cli_reference());
    Ok(ExitCode::SUCCESS)
}

/// The whole reference page as Markdown.
pub fn cli_reference() -> String {
    let mut root = Cli::command();
    root.build();
    let mut out = String::new();
    let _ = writeln!(out, "# Command-line reference\n");
    let _ = writeln!(
        out,
        "<!-- Generated from the clap definitions by `promptforge reference`; do not edit. -->\n"
    );
    if let Some(about) = root.get_about() {
        let _ = writeln!(out, "{about}.\n");
    }
    let _ = writeln!(out, "```text\n{}\n```\n", usage(&mut root));
    let globals: Vec<&Arg> = root
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_long().is_some_and(|l| l != "help" && l != "version"))
        .collect();
    if !globals.is_empty() {
        let _ = writeln!(out, "Options for every command:\n");
        for arg in globals {
            let _ = writeln!(out, "{}", arg_line(arg));
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "Exit status: 0 completed (or no errors), 1 failed (a run error, a parse error, a `check` error), \
         2 usage error (bad flag, unreadable file or host file), 130 cancelled.\n"
    );
    let subcommands: Vec<clap::Command> = root
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    for mut sub in subcommands {
        let name = sub.get_name().to_string();
        let _ = writeln!(out, "## `promptforge {name}`\n");
        if let Some(about) = sub.get_about() {
            let _ = writeln!(out, "{about}\n");
        }
        let _ = writeln!(out, "```text\n{}\n```\n", usage(&mut sub));
        let positionals: Vec<&Arg> = sub.get_positionals().filter(|a| !a.is_hide_set()).collect();
        if !positionals.is_empty() {
            let _ = writeln!(out, "Arguments:\n");
            for arg in positionals {
                let _ = writeln!(out, "{}", arg_line(arg));
            }
            let _ = writeln!(out);
        }
        let flags: Vec<&Arg> = sub
            .get_arguments()
            .filter(|a| !a.is_positional() && !a.is_hide_set() && !a.is_global_set())
            .filter(|a| a.get_long() != Some("help"))
            .collect();
        if !flags.is_empty() {
            let _ = writeln!(out, "Options:\n");
            for arg in flags {
                let _ = writeln!(out, "{}", arg_line(arg));
            }
            let _ = writeln!(out);
        }
        if let Some(after) = sub.get_after_help() {
            let _ = writeln!(out, "```text\n{}\n```\n", after.to_string().trim_end());
        }
    }
    out.trim_end().to_string() + "\n"
}

fn usage(command: &mut clap::Command) -> String {
    command
        .render_usage()
        .to_string()
        .trim_start_matches("Usage: ")
        .trim()
        .to_string()
}

/// `- `--flag <VALUE>`: help (default: x; values: a, b)`.
fn arg_line(arg: &Arg) -> String {
    let value_names: Vec<String> = arg
        .get_value_names()
        .map(|names| names.iter().map(|n| format!("<{n}>")).collect())
        .unwrap_or_else(|| vec![format!("<{}>", arg.get_id().as_str().to_uppercase())]);
    let takes_value = arg.get_action().takes_values();
    let mut name = match (arg.get_short(), arg.get_long()) {
        (Some(s), Some(l)) => format!("-{s}, --{l}"),
        (None, Some(l)) => format!("--{l}"),
        (Some(s), None) => format!("-{s}"),
        (None, None) => value_names.join(" "),
    };
    if takes_value && !arg.is_positional() {
        name = format!("{name} {}", value_names.join(" "));
    }
    let mut line = format!("- `{name}`");
    if let Some(help) = arg.get_help() {
        let _ = write!(line, ": {help}");
    }
    let mut extras = Vec::new();
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    if takes_value && !values.is_empty() {
        extras.push(format!("values: {}", values.join(", ")));
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && takes_value {
        extras.push(format!("default: {}", defaults.join(", ")));
    }
    if arg.is_required_set() {
        extras.push("required".to_string());
    }
    if matches!(arg.get_action(), clap::ArgAction::Append) {
        extras.push("repeatable".to_string());
    }
    if !extras.is_empty() {
        let _ = write!(line, " ({})", extras.join("; "));
    }
    line
}
