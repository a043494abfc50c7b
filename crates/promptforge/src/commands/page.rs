//! `show RUN --html`: write the trace page to stdout or `--output FILE`, or
//! with `--open` into the data directory and hand it to the desktop's opener.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cli::PageArgs;
use pf_trace::LoggedRun;

/// Render the page and put it where `args` says.
pub fn show(run: &LoggedRun, args: &PageArgs) -> ExitCode {
    let page = pf_trace::html::render(run);
    if args.open {
        return open(run, &page, args.output.as_deref());
    }
    match &args.output {
        Some(path) => match write_file(path, &page) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => fail(&message),
        },
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(page.as_bytes()).and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::from(crate::EXIT_FAILED),
            }
        }
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(crate::EXIT_FAILED)
}

fn write_file(path: &Path, page: &str) -> Result<(), String> {
    std::fs::write(path, page).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Where `--open` writes when no `--output` is given: `pages/` in the data
/// directory (private, like the log it is drawn from), else the temp folder.
fn default_page_path(run: &LoggedRun) -> PathBuf {
    let name = format!("{}-{}.html", run.record.start.execution, run.record.id.0);
    let in_data_dir = pf_host::data::run_log_path()
        .and_then(|db| db.parent().map(|dir| dir.join("pages")))
        .filter(|dir| pf_host::data::create_private_dir(dir).is_ok());
    in_data_dir.unwrap_or_else(std::env::temp_dir).join(name)
}

/// Write the page, then open it; a missing or failing opener is not an
/// error (the page is written and its path printed either way).
fn open(run: &LoggedRun, page: &str, output: Option<&Path>) -> ExitCode {
    let path = output.map_or_else(|| default_page_path(run), Path::to_path_buf);
    if let Err(message) = write_file(&path, page) {
        return fail(&message);
    }
    let path = std::path::absolute(&path).unwrap_or(path);
    crate::ui::print_stdout(&format!("{}\n", path.display()));
    open_in_browser(&path);
    ExitCode::SUCCESS
}

/// Hand a written page to the desktop's opener; a missing or failing opener
/// is a warning naming the page.
pub fn open_in_browser(path: &Path) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let started = std::process::Command::new(opener)
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match started {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!(
            "warning: {opener} could not open the page ({status}); open {} in a browser",
            path.display()
        ),
        Err(e) => eprintln!(
            "warning: cannot run {opener} ({e}); open {} in a browser",
            path.display()
        ),
    }
}
