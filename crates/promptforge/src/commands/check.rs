//! `promptforge check PATH...`: every problem of every prompt file, without
//! running anything. Folders are searched for `*.md` files that start with
//! `---`. Syntax problems come from [`pf_syntax::diagnose`]; the checks
//! prepare would make (and a few static ones over the Lua blocks) come from
//! [`super::prepare_checks`]. Errors fail the exit status, warnings do not.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pf_host::HostError;

use pf_syntax::Severity;

use super::prepare_checks::{self, Problem};
use crate::cli::{CheckArgs, CheckFormat, OutputFormat};
use pf_host::HostConfig;

pub fn run(args: CheckArgs) -> Result<ExitCode, HostError> {
    let mut files = Vec::new();
    for path in &args.paths {
        let before = files.len();
        collect(path, &mut files)?;
        if files.len() == before {
            // A folder with no prompt in it: say so, rather than pass in silence.
            eprintln!(
                "warning: no prompt files in {} (a prompt is a `.md` file whose first line is `---`)",
                pf_host::report::terminal_safe(&path.display().to_string())
            );
        }
    }
    let host = match &args.host {
        Some(path) => Some(HostConfig::load(Some(path))?),
        None => None,
    };
    // A model whose server the Host would start needs that server's command.
    for spec in host.iter().flat_map(|h| &h.catalog) {
        if let Some(Err(why)) = spec.spawn.as_ref().map(pf_models::SpawnSpec::find_program) {
            return Err(HostError::HostFile(format!(
                "host file: model \"{}\": `spawn`: {why}",
                spec.id
            )));
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| HostError::Usage(format!("cannot start the async runtime: {e}")))?;
    // The host's Plugins are activated once and their tools listed for every file.
    let offered = match &host {
        Some(config) => Some(runtime.block_on(prepare_checks::offered_tools(config, &files))?),
        None => None,
    };
    let mut reports = Vec::new();
    for file in &files {
        let source = pf_host::prompt_files::read_prompt(file)?;
        let problems = check_source(&source, host.as_ref(), offered.as_ref());
        reports.push(FileReport {
            file: file.clone(),
            source,
            problems,
        });
    }
    let errors: usize = reports.iter().map(|r| r.count(Severity::Error)).sum();
    let warnings: usize = reports.iter().map(|r| r.count(Severity::Warning)).sum();
    if args.output.format() == OutputFormat::Json {
        crate::ui::print_stdout(&format!("{}\n", json_report(&reports, errors, warnings)));
    } else {
        let rich = match args.format {
            Some(format) => format == CheckFormat::Rich,
            None => std::io::stdout().is_terminal(),
        };
        let color = crate::ui::stdout_color();
        let mut out = std::io::stdout().lock();
        for report in &reports {
            let _ = report.write(&mut out, rich, color);
        }
        if rich && (errors > 0 || warnings > 0) {
            eprintln!(
                "{} error{}, {} warning{} in {} file{}",
                errors,
                plural(errors),
                warnings,
                plural(warnings),
                reports.len(),
                plural(reports.len())
            );
        }
    }
    Ok(if errors > 0 {
        ExitCode::from(crate::EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Every problem of one prompt's bytes: the parser's, then (when it parses)
/// the static checks over its Lua blocks and frontmatter, then the host's.
pub fn check_source(
    source: &[u8],
    host: Option<&HostConfig>,
    offered: Option<&prepare_checks::OfferedTools>,
) -> Vec<Problem> {
    let diagnostics = pf_syntax::diagnose(source);
    let mut problems: Vec<Problem> = diagnostics.iter().map(Problem::from_syntax).collect();
    if diagnostics.has_errors() {
        return problems;
    }
    let Ok(prompt) = pf_syntax::parse(source) else {
        return problems;
    };
    let text = String::from_utf8_lossy(source);
    problems.extend(prepare_checks::static_problems(&prompt, &text));
    if let (Some(host), Some(offered)) = (host, offered) {
        problems.extend(prepare_checks::host_problems(&prompt, &text, host, offered));
    }
    problems
}

/// The files one PATH names: itself, or the prompt-like `*.md` files under it.
fn collect(path: &Path, files: &mut Vec<PathBuf>) -> Result<(), HostError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| HostError::Input(format!("cannot read {}: {e}", path.display())))?;
    if !meta.is_dir() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| HostError::Input(format!("cannot read folder {}: {e}", path.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for entry in entries {
        let name = entry.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        // Hidden folders, build output and dependencies hold no prompts of ours.
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if entry.is_dir() {
            collect(&entry, files)?;
        } else if name.ends_with(".md") && looks_like_a_prompt(&entry) {
            files.push(entry);
        }
    }
    Ok(())
}

/// A Markdown file is taken for a prompt when it opens with a `---` line.
fn looks_like_a_prompt(path: &Path) -> bool {
    // Only the opening line matters: a huge file or a device is not read whole.
    use std::io::Read;
    let mut bytes = Vec::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(4096).read_to_end(&mut bytes));
    if read.is_err() {
        return false;
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let first = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    first.trim_ascii() == b"---"
}

struct FileReport {
    file: PathBuf,
    source: Vec<u8>,
    problems: Vec<Problem>,
}

impl FileReport {
    fn count(&self, severity: Severity) -> usize {
        self.problems
            .iter()
            .filter(|p| p.severity == severity)
            .count()
    }

    fn name(&self) -> String {
        self.file.display().to_string()
    }

    fn write(&self, out: &mut impl std::io::Write, rich: bool, color: bool) -> std::io::Result<()> {
        let name = self.name();
        // A message, file name or source line a prompt chose must not drive the
        // terminal: control characters are shown escaped. Colour differs from
        // the plain rendering only by our own escapes around the same parts, so
        // it is used exactly when the plain rendering needs no escaping.
        let unsafe_source = String::from_utf8_lossy(&self.source)
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\r');
        for problem in &self.problems {
            if !rich {
                let line = problem.one_line(&name);
                writeln!(out, "{}", pf_host::report::terminal_safe(&line))?;
                continue;
            }
            let plain = problem.render(&name, &self.source, false);
            let safe = pf_host::report::terminal_safe(&plain);
            if color && !unsafe_source && matches!(safe, std::borrow::Cow::Borrowed(_)) {
                writeln!(out, "{}", problem.render(&name, &self.source, true))?;
            } else {
                writeln!(out, "{safe}")?;
            }
        }
        Ok(())
    }
}

fn json_report(reports: &[FileReport], errors: usize, warnings: usize) -> String {
    let files: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| {
            let name = r.name();
            serde_json::json!({
                "file": name,
                "diagnostics": r.problems.iter().map(|p| p.to_json(&name)).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({"files": files, "errors": errors, "warnings": warnings}).to_string()
}
