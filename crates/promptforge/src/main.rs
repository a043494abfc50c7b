//! The `promptforge` binary: parse the command line and dispatch.

use std::process::ExitCode;

use clap::Parser;
use promptforge::cli::Cli;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Read before parsing so a usage error can honour them too.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let flag = |name: &str| raw.iter().skip(1).any(|a| a == name);
    promptforge::ui::set_json_errors(flag("--json"));
    match Cli::try_parse() {
        Ok(cli) => {
            // `--color` first: the log's colour follows it.
            promptforge::ui::set_color_choice(cli.color);
            if flag("--quiet") || flag("-q") {
                promptforge::init_logging_with_default("error");
            } else {
                promptforge::init_logging();
            }
            let code = promptforge::commands::dispatch(cli.command)
                .unwrap_or_else(|e| promptforge::commands::render_error(&e));
            // Model servers the catalog spawned end with the process, on every
            // way out of a command (the forced exit of a second signal kills them).
            pf_models::stop_spawned_servers();
            code
        }
        Err(e) => {
            if !e.use_stderr() {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if promptforge::ui::json_errors() {
                let message = e.kind().to_string();
                let detail = e.to_string();
                let first = detail
                    .lines()
                    .find(|l| l.starts_with("error:"))
                    .map(|l| l.trim_start_matches("error:").trim().to_string())
                    .unwrap_or(message);
                if let Some(object) = pf_host::HostError::Usage(first).json_object() {
                    promptforge::ui::print_stdout(&format!("{object}\n"));
                }
            } else {
                let _ = e.print();
            }
            ExitCode::from(promptforge::EXIT_USAGE)
        }
    }
}
