//! Terminal conventions every command shares: when to colour, whether usage
//! errors print as JSON. Set once by `main` from the command line, read
//! anywhere, so commands need no extra parameters for them.

use std::io::IsTerminal;
use std::sync::OnceLock;

use crate::cli::ColorChoice;

static COLOR: OnceLock<ColorChoice> = OnceLock::new();
static JSON_ERRORS: OnceLock<bool> = OnceLock::new();

/// Record `--color` (call once, before dispatch).
pub fn set_color_choice(choice: ColorChoice) {
    let _ = COLOR.set(choice);
}

/// Record that the command line asked for `--json`, so a usage error prints
/// a JSON object too.
pub fn set_json_errors(json: bool) {
    let _ = JSON_ERRORS.set(json);
}

pub fn json_errors() -> bool {
    JSON_ERRORS.get().copied().unwrap_or(false)
}

/// Whether text for stderr gets ANSI colour: `--color always|never`, else
/// only when stderr is a terminal and `NO_COLOR` is unset or empty.
pub fn stderr_color() -> bool {
    resolve(
        COLOR.get().copied().unwrap_or_default(),
        std::io::stderr().is_terminal(),
    )
}

/// Whether text for stdout gets ANSI colour (the same rule, for stdout).
pub fn stdout_color() -> bool {
    resolve(
        COLOR.get().copied().unwrap_or_default(),
        std::io::stdout().is_terminal(),
    )
}

fn resolve(choice: ColorChoice, is_terminal: bool) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        }
    }
}

/// A `warning:` line on stderr. Warnings may carry a server's or a file's
/// words, so control characters are shown escaped, as in error text.
pub fn warn(message: &str) {
    eprintln!("warning: {}", pf_host::report::terminal_safe(message));
}

/// Text from outside (a run's result, a model's or a page's words) as it may
/// go to stdout: escaped when stdout is a terminal, so an OSC, CSI or DCS
/// sequence cannot drive it (retitle the window, write the clipboard, clear
/// the screen); byte-exact to a pipe or a file.
pub fn stdout_text(text: &str) -> std::borrow::Cow<'_, str> {
    if std::io::stdout().is_terminal() {
        pf_host::report::terminal_safe(text)
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Write `text` to stdout, ignoring a closed stdout (`| head`): output that
/// nobody reads is not an error, and `print!` would panic on it.
pub fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// The exit status after writing a command's output: a closed stdout
/// (`| head -1`) ends the command quietly with 0, as nobody reads the rest.
pub fn written(result: std::io::Result<()>) -> Result<std::process::ExitCode, pf_host::HostError> {
    match result {
        Ok(()) => Ok(std::process::ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(std::process::ExitCode::SUCCESS),
        Err(e) => Err(pf_host::HostError::Output(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_and_always_win_over_the_terminal() {
        assert!(!resolve(ColorChoice::Never, true));
        assert!(resolve(ColorChoice::Always, false));
        assert!(!resolve(ColorChoice::Auto, false));
    }
}
