//! `promptforge completions SHELL` and the hidden `promptforge man`: both
//! generated from the clap definitions in [`crate::cli`], so they cannot drift.

use std::process::ExitCode;

use pf_host::HostError;

use clap::CommandFactory;

use crate::cli::{Cli, CompletionShell, CompletionsArgs};

pub fn run(args: CompletionsArgs) -> Result<ExitCode, HostError> {
    let shell = match args.shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let mut command = Cli::command();
    // Generated into memory first: clap_complete panics on a failed write.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "promptforge", &mut script);
    use std::io::Write;
    let _ = std::io::stdout().write_all(&script);
    Ok(ExitCode::SUCCESS)
}

/// The man page (roff) for `promptforge` and each subcommand, on stdout.
pub fn man() -> Result<ExitCode, HostError> {
    match man_page() {
        Ok(bytes) => {
            use std::io::Write;
            let _ = std::io::stdout().write_all(&bytes);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(HostError::Usage(format!("cannot render the man page: {e}"))),
    }
}

/// `promptforge.1`: the top page followed by one section per visible subcommand.
pub fn man_page() -> std::io::Result<Vec<u8>> {
    let command = Cli::command();
    let mut out = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut out)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        clap_mangen::Man::new(sub.clone()).render(&mut out)?;
    }
    Ok(out)
}
