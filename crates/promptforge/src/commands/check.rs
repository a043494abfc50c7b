//! `promptforge check FILE`: parse only.

use std::io::Write;
use std::process::ExitCode;

use crate::cli::CheckArgs;

pub fn run(args: CheckArgs) -> ExitCode {
    let file = &args.file;
    let source = match super::read_prompt(file) {
        Ok(s) => s,
        Err(m) => return super::usage(&m),
    };
    match pf_syntax::parse(&source) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(
                std::io::stdout(),
                "{}:{}:{}: {}: {}",
                file.display(),
                e.line.unwrap_or(1),
                e.column.unwrap_or(1),
                e.kind.as_str(),
                crate::report::terminal_safe(&e.message)
            );
            ExitCode::from(crate::EXIT_FAILED)
        }
    }
}
