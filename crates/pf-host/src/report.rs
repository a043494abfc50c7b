//! The run report: what `run` prints (as JSON with `--json`, as text without)
//! and what later commands read back. One type, so the printed forms cannot
//! drift apart. Field order is the wire order (SPEC.md, "--json report").

use std::io::Write;
use std::path::{Path, PathBuf};

use pf_engine::Outcome;
use serde::{Deserialize, Serialize};

/// Whether output is for a person or for a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Human,
    Json,
}

/// One run's report. A run that never started (the prompt did not parse) has
/// only its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    #[serde(flatten)]
    pub outcome: ReportOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<String>,
    /// The run's store directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<PathBuf>,
    /// The declared output file, after a completed run that declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<ReportOutput>,
    /// Tokens used over every model round, when the provider reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ReportUsage>,
}

/// Token usage totals of a run, summed over its rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// How the run ended (`"outcome"`), with what that ending carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum ReportOutcome {
    Completed { result: String },
    Failed { error: ReportError },
    Cancelled,
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportError {
    /// A run error kind, a parse error kind (`Frontmatter`, `Lua`, …) or the Host's own.
    pub kind: crate::error::ErrorKind,
    /// `parse` when the prompt did not parse; absent for a run failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ErrorPhase>,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
}

/// The phase a failure happened in, when it was not the run itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorPhase {
    Parse,
}

/// The declared output file: where it is, or why it could not be collected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportOutput {
    /// The path the prompt declared, inside the store.
    pub path: String,
    /// The file on disk, when the store is a directory the operator can open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RunReport {
    /// The report of a run that went through the engine.
    pub fn of_run(seed: u64, run: &pf_engine::RunReport, store: &Path) -> Self {
        let outcome = match &run.outcome {
            Outcome::Completed(text) => ReportOutcome::Completed {
                result: text.clone(),
            },
            Outcome::Failed(e) => ReportOutcome::Failed {
                error: ReportError {
                    kind: e.kind.into(),
                    phase: None,
                    message: e.message.clone(),
                    line: None,
                    column: None,
                },
            },
            Outcome::Cancelled => ReportOutcome::Cancelled,
        };
        RunReport {
            outcome,
            seed: Some(seed),
            execution: Some(run.execution.clone()),
            store: Some(store.to_path_buf()),
            output: None,
            usage: None,
        }
    }

    /// The report of a run cancelled before it could finish (a second signal).
    pub fn of_cancelled(seed: u64, execution: &str, store: &Path) -> Self {
        RunReport {
            outcome: ReportOutcome::Cancelled,
            seed: Some(seed),
            execution: Some(execution.to_string()),
            store: Some(store.to_path_buf()),
            output: None,
            usage: None,
        }
    }

    /// The report of a prompt that did not parse: no run, so no seed or store.
    pub fn of_parse_failure(e: &pf_syntax::ParseError) -> Self {
        RunReport {
            outcome: ReportOutcome::Failed {
                error: ReportError {
                    kind: e.kind.into(),
                    phase: Some(ErrorPhase::Parse),
                    message: e.message.clone(),
                    line: e.line,
                    column: e.column,
                },
            },
            seed: None,
            execution: None,
            store: None,
            output: None,
            usage: None,
        }
    }

    /// The outcome as the run log (and the OTLP export) records it.
    pub fn logged_outcome(&self) -> pf_runlog::Outcome {
        match &self.outcome {
            ReportOutcome::Completed { result } => pf_runlog::Outcome::Completed {
                result: result.clone(),
            },
            ReportOutcome::Failed { error } => pf_runlog::Outcome::Failed {
                kind: error.kind.as_str().to_string(),
                message: error.message.clone(),
            },
            ReportOutcome::Cancelled => pf_runlog::Outcome::Cancelled,
        }
    }

    /// The report as one line of JSON.
    pub fn to_json_line(&self) -> String {
        // Serializing plain strings, numbers and UTF-8 paths cannot fail; a
        // non-UTF-8 store path is the one way, and then the path is left out.
        serde_json::to_string(self).unwrap_or_else(|_| {
            let mut lossy = self.clone();
            lossy.store = self
                .store
                .as_ref()
                .map(|s| PathBuf::from(s.to_string_lossy().into_owned()));
            lossy.output = None;
            serde_json::to_string(&lossy).unwrap_or_default()
        })
    }

    /// Print the report: JSON on stdout, or the result on stdout and the rest
    /// on stderr. `prompt_file` names the prompt in parse-error lines.
    /// A result printed for a person on a terminal has its control
    /// characters escaped ([`crate::report::stdout_text`]); to a pipe or a file
    /// it stays byte-exact.
    pub fn print(&self, format: OutputFormat, prompt_file: &Path) {
        let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
        if let (OutputFormat::Human, ReportOutcome::Completed { result }) = (format, &self.outcome)
        {
            if let std::borrow::Cow::Owned(escaped) = crate::report::stdout_text(result) {
                let mut shown = self.clone();
                shown.outcome = ReportOutcome::Completed { result: escaped };
                let _ = shown.write(format, prompt_file, &mut out, &mut err);
                return;
            }
        }
        let _ = self.write(format, prompt_file, &mut out, &mut err);
    }

    /// [`RunReport::print`] into any pair of writers.
    pub fn write(
        &self,
        format: OutputFormat,
        prompt_file: &Path,
        out: &mut impl Write,
        err: &mut impl Write,
    ) -> std::io::Result<()> {
        if format == OutputFormat::Json {
            return writeln!(out, "{}", self.to_json_line());
        }
        match &self.outcome {
            ReportOutcome::Completed { result } => {
                if let Some(output) = self.output.as_ref().filter(|o| o.error.is_none()) {
                    match &output.file {
                        Some(file) => {
                            writeln!(err, "output file {}: {}", output.path, file.display())?
                        }
                        None => writeln!(
                            err,
                            "output file {} is in the store {}",
                            output.path,
                            self.store.as_deref().unwrap_or(Path::new("")).display()
                        )?,
                    }
                }
                writeln!(out, "{result}")
            }
            ReportOutcome::Failed { error } if error.phase == Some(ErrorPhase::Parse) => {
                let file = prompt_file.display();
                match (error.line, error.column) {
                    (Some(l), Some(c)) => writeln!(
                        err,
                        "{file}:{l}:{c}: error[{}]: {}",
                        error.kind,
                        terminal_safe(&error.message)
                    ),
                    _ => writeln!(
                        err,
                        "{file}: error[{}]: {}",
                        error.kind,
                        terminal_safe(&error.message)
                    ),
                }
            }
            ReportOutcome::Failed { error } => {
                writeln!(
                    err,
                    "error[{}]: {}",
                    error.kind,
                    terminal_safe(&error.message)
                )
            }
            ReportOutcome::Cancelled => writeln!(err, "cancelled"),
        }
    }
}

/// Error text made safe to print on a terminal: control characters other than
/// newline and tab (escape sequences, carriage returns, C1 controls) are shown
/// escaped, so a message a prompt or server chose cannot drive the terminal.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A warning on stderr, its text escaped for a terminal: messages quote
/// paths, prompt text and server words, any of which may carry control
/// sequences.
pub fn warn(message: &str) {
    eprintln!("warning: {}", terminal_safe(message));
}

/// Text from outside (a run's result, a model's or a page's words) as it may
/// go to stdout: escaped when stdout is a terminal, so an OSC, CSI or DCS
/// sequence cannot drive it; byte-exact to a pipe or a file.
pub fn stdout_text(text: &str) -> std::borrow::Cow<'_, str> {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        terminal_safe(text)
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_text_escapes_control_characters() {
        assert_eq!(terminal_safe("plain\nline\tok"), "plain\nline\tok");
        assert_eq!(
            terminal_safe("a\u{1b}[2Jb\rc\u{9b}"),
            "a\\u{1b}[2Jb\\rc\\u{9b}"
        );
    }

    fn completed() -> RunReport {
        RunReport {
            outcome: ReportOutcome::Completed {
                result: "hi".into(),
            },
            seed: Some(7),
            execution: Some("run-x".into()),
            store: Some("/tmp/s".into()),
            output: Some(ReportOutput {
                path: "out.md".into(),
                file: Some("/tmp/s/out.md".into()),
                error: None,
            }),
            usage: None,
        }
    }

    #[test]
    fn json_keeps_the_wire_order_and_reads_back() {
        let report = completed();
        let line = report.to_json_line();
        assert_eq!(
            line,
            r#"{"outcome":"completed","result":"hi","seed":7,"execution":"run-x","store":"/tmp/s","output":{"path":"out.md","file":"/tmp/s/out.md"}}"#
        );
        let back: RunReport = serde_json::from_str(&line).expect("reads back");
        assert_eq!(back, report);
    }

    #[test]
    fn a_parse_failure_has_only_its_error() {
        let report = RunReport::of_parse_failure(&pf_syntax::ParseError {
            kind: pf_syntax::ParseErrorKind::Frontmatter,
            message: "bad".into(),
            line: Some(3),
            column: Some(5),
        });
        assert_eq!(
            report.to_json_line(),
            r#"{"outcome":"failed","error":{"kind":"Frontmatter","phase":"parse","message":"bad","line":3,"column":5}}"#
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        report
            .write(OutputFormat::Human, Path::new("p.md"), &mut out, &mut err)
            .expect("write");
        assert!(out.is_empty());
        assert_eq!(
            String::from_utf8_lossy(&err),
            "p.md:3:5: error[Frontmatter]: bad\n"
        );
    }

    #[test]
    fn a_person_sees_the_result_and_where_the_output_went() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        completed()
            .write(OutputFormat::Human, Path::new("p.md"), &mut out, &mut err)
            .expect("write");
        assert_eq!(String::from_utf8_lossy(&out), "hi\n");
        assert_eq!(
            String::from_utf8_lossy(&err),
            "output file out.md: /tmp/s/out.md\n"
        );
    }

    #[test]
    fn cancelled_reads_back() {
        let line = r#"{"outcome":"cancelled","seed":1,"execution":"run-y","store":"/s"}"#;
        let report: RunReport = serde_json::from_str(line).expect("reads");
        assert_eq!(report.outcome, ReportOutcome::Cancelled);
        assert_eq!(report.to_json_line(), line);
    }
}
