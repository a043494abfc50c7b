//! One module per subcommand, each `pub fn run(args) -> ExitCode`. Adding a
//! command: a variant in [`crate::cli::Command`], a module here, an arm below.

pub mod check;
pub mod completions;
pub mod info;
pub mod init;
pub mod mcp;
pub mod models;
pub mod prepare_checks;
pub mod reference;
pub mod replay;
pub mod run;
pub mod runs;
pub mod show;
pub mod test;

use std::path::Path;
use std::process::ExitCode;

use crate::cli::Command;

/// Run the subcommand the command line chose.
pub fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Run(args) => run::run(args),
        Command::Check(args) => check::run(args),
        Command::Models(args) => models::run(args),
        Command::Runs(args) => runs::run(args),
        Command::Show(args) => show::run(args),
        Command::Test(args) => test::run(args),
        Command::Info(args) => info::run(args),
        Command::Init(args) => init::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Man => completions::man(),
        Command::Reference => reference::run(),
        Command::Mcp(args) => mcp::run(args),
        Command::Replay(args) => replay::run(args),
    }
}

/// A usage error: the message on stderr (under `--json`, a JSON object on
/// stdout as well), exit status 2.
pub(crate) fn usage(msg: &str) -> ExitCode {
    if crate::ui::json_errors() {
        crate::ui::print_stdout(&format!("{}\n", crate::ui::usage_error_json(msg)));
    }
    eprintln!("error: {}", crate::report::terminal_safe(msg));
    ExitCode::from(crate::EXIT_USAGE)
}

/// The largest prompt file read, so `run /dev/zero` cannot grow without bound.
pub(crate) const MAX_PROMPT_BYTES: u64 = crate::MAX_INPUT_BYTES;

/// The prompt file's bytes, or a message naming it.
pub(crate) fn read_prompt(file: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", file.display());
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .map_err(cannot)?
        .take(MAX_PROMPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        return Err(format!(
            "cannot read {}: the prompt file is larger than {} MiB",
            file.display(),
            MAX_PROMPT_BYTES / (1024 * 1024)
        ));
    }
    Ok(bytes)
}
