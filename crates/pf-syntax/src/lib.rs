//! Parses promptforge prompt files: frontmatter, body, and a compile check of
//! every Lua block. Pure: no I/O, never panics on any input.

pub mod ast;
mod body;
mod diagnostics;
mod frontmatter;
mod heading;
mod lua_check;
pub mod names;
mod yaml;

pub use ast::*;
pub use diagnostics::{
    diagnostic_json, render_diagnostic, Diagnostic, DiagnosticKind, DiagnosticPlace, Diagnostics,
    Severity,
};
pub use frontmatter::ROLE_KEYWORDS;
pub use heading::{heading_of, parse_heading_ref, resolve_heading, HeadingRef};
pub use names::{
    check_plugin_id, check_tool_path, host_globals, is_reserved_name, is_valid_name,
    is_valid_segment, sandbox_globals, Built, GlobalKind, LuaGlobal, Suspends, LUA_GLOBALS,
    LUA_KEYWORDS, NAME_GRAMMAR,
};

/// The `Structure` message for a prompt run without a `promptforge:` key
/// (raised at run time: such a file still parses).
pub const NOT_A_PROMPT: &str = "not a promptforge prompt: no promptforge version";

/// The run error `Version` message for a declared major other than 0.
pub fn unsupported_version_message(major: u64) -> String {
    format!("unsupported promptforge version: {major} (this build supports major 0)")
}

/// Why a parsed prompt may not run on this build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionProblem {
    /// No `promptforge:` key: the file parses but is not a prompt ([`NOT_A_PROMPT`]).
    NotAPrompt,
    /// A declared major this build does not run.
    Unsupported(u64),
}

impl VersionProblem {
    /// The message the run reports.
    pub fn message(self) -> String {
        match self {
            VersionProblem::NotAPrompt => NOT_A_PROMPT.to_string(),
            VersionProblem::Unsupported(major) => unsupported_version_message(major),
        }
    }
}

/// The version rules: `Ok` when the prompt may run (major 0).
pub fn check_version(prompt: &Prompt) -> Result<(), VersionProblem> {
    match prompt.frontmatter.version {
        None => Err(VersionProblem::NotAPrompt),
        Some(VersionValue::Major(0)) => Ok(()),
        Some(VersionValue::Major(major)) => Err(VersionProblem::Unsupported(major)),
    }
}

/// A parse failure with the prompt's frontmatter `name` when it was read
/// (body failures carry it; frontmatter failures cannot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseFailure {
    pub error: ParseError,
    pub prompt_name: Option<String>,
}

/// Parse a prompt file. Never panics, never does I/O.
pub fn parse(source: &[u8]) -> Result<Prompt, ParseError> {
    parse_detailed(source).map_err(|failure| failure.error)
}

fn located(kind: ParseErrorKind, message: &str, line: u32, column: u32) -> ParseError {
    ParseError {
        kind,
        message: message.to_string(),
        line: Some(line),
        column: Some(column),
    }
}

/// Reports the first invalid UTF-8 byte: in the frontmatter it is a
/// `Frontmatter` failure, in the body a `Structure` one.
fn utf8_failure(source: &[u8], valid_up_to: usize) -> ParseError {
    let before = source.get(..valid_up_to).unwrap_or_default();
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map(|i| i + 1)
        .unwrap_or(0);
    let column = valid_up_to - line_start + 1;
    // Where does the frontmatter end? Delimiter lines are plain ASCII.
    let mut lines = source.split(|b| *b == b'\n');
    let is_delimiter = |l: &[u8]| l.trim_ascii() == b"---";
    let mut closing_line = None;
    if lines.next().is_some_and(is_delimiter) {
        closing_line = Some(usize::MAX);
        for (index, l) in lines.enumerate() {
            if is_delimiter(l) {
                closing_line = Some(index + 2);
                break;
            }
        }
    }
    let in_frontmatter = closing_line.is_some_and(|closing| line <= closing);
    let (kind, message) = if in_frontmatter {
        (
            ParseErrorKind::Frontmatter,
            "invalid frontmatter: the frontmatter is not valid UTF-8",
        )
    } else {
        (ParseErrorKind::Structure, "prompt file is not valid UTF-8")
    };
    located(
        kind,
        message,
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(column).unwrap_or(u32::MAX),
    )
}

/// Like [`parse`], but a failure also carries the prompt's `name` when known.
pub fn parse_detailed(source: &[u8]) -> Result<Prompt, ParseFailure> {
    let analysis = analyze(source);
    match analysis
        .diagnostics
        .first()
        .and_then(Diagnostic::to_parse_error)
    {
        None => analysis.prompt.ok_or(ParseFailure {
            // Unreachable: a prompt is built whenever nothing was recorded.
            error: ParseError {
                kind: ParseErrorKind::Structure,
                message: "prompt could not be parsed".to_string(),
                line: None,
                column: None,
            },
            prompt_name: None,
        }),
        Some(error) => Err(ParseFailure {
            prompt_name: if error.kind == ParseErrorKind::Frontmatter {
                None
            } else {
                analysis.prompt_name
            },
            error,
        }),
    }
}

/// Every problem the parser finds, not only the first, and then the version
/// rule `run` applies: a file without `promptforge:` is [`NOT_A_PROMPT`]
/// (`Structure`), a major other than 0 is `Version`. The first error is
/// always the one [`parse`] returns (kind, message, line, column; see
/// [`Diagnostic::to_parse_error`]), or, for a file that parses, the one `run`
/// refuses it with. Never panics, never does I/O.
pub fn diagnose(source: &[u8]) -> Diagnostics {
    let analysis = analyze(source);
    let mut diagnostics = analysis.diagnostics;
    if let Some(version_key) = analysis.version_key {
        match analysis.version {
            None if !version_key.written => diagnostics.push(
                Diagnostic::error(located(ParseErrorKind::Structure, NOT_A_PROMPT, 1, 1))
                    .located_beyond_parse(1, 1)
                    .with_span(3)
                    .with_help(Some("add `promptforge: 0` to the frontmatter".to_string())),
            ),
            Some(VersionValue::Major(major)) if major != 0 => {
                let mark = version_key
                    .value_mark
                    .unwrap_or(yaml::Mark { line: 1, column: 1 });
                diagnostics.push(
                    Diagnostic::error(located(
                        ParseErrorKind::Structure,
                        &unsupported_version_message(major),
                        mark.line,
                        mark.column,
                    ))
                    .with_kind(DiagnosticKind::Version)
                    .with_span(major.to_string().len())
                    .with_help(Some("this build runs `promptforge: 0`".to_string())),
                );
            }
            _ => {}
        }
    }
    let text = text_of(source);
    let lines: Vec<&str> = text.split('\n').collect();
    for diagnostic in &mut diagnostics {
        let at_a_value = !diagnostic.message.contains("missing field");
        if diagnostic.kind == DiagnosticKind::Frontmatter
            && diagnostic.span_len.is_none()
            && at_a_value
        {
            diagnostic.span_len = scalar_len_at(&lines, diagnostic.line, diagnostic.column);
        }
    }
    Diagnostics { diagnostics }
}

/// The source as text for locating spans (lossy: only lengths are taken).
fn text_of(source: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(source.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(source))
}

/// The length of the YAML scalar written at `line:column` (up to a blank,
/// `,`, `]`, `}` or `:`), so a caret covers the whole value or key.
fn scalar_len_at(lines: &[&str], line: Option<u32>, column: Option<u32>) -> Option<u32> {
    let line_text = lines.get(usize::try_from(line?).ok()?.checked_sub(1)?)?;
    let rest = line_text.get(usize::try_from(column?).ok()?.checked_sub(1)?..)?;
    let len = rest
        .find(|c: char| c.is_whitespace() || matches!(c, ',' | ']' | '}' | ':'))
        .unwrap_or(rest.len());
    u32::try_from(len).ok().filter(|len| *len > 0)
}

/// One pass over the file: the prompt as far as it could be built and every
/// problem met, in `parse` order.
struct Analysis {
    prompt: Option<Prompt>,
    diagnostics: Vec<Diagnostic>,
    prompt_name: Option<String>,
    /// `None` when the frontmatter could not be read as keys at all.
    version_key: Option<frontmatter::VersionKey>,
    version: Option<VersionValue>,
}

fn analyze(source: &[u8]) -> Analysis {
    let stopped = |error: ParseError| Analysis {
        prompt: None,
        diagnostics: vec![Diagnostic::error(error)],
        prompt_name: None,
        version_key: None,
        version: None,
    };
    let source = source.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(source);
    let text = match std::str::from_utf8(source) {
        Ok(text) => text,
        Err(e) => return stopped(utf8_failure(source, e.valid_up_to())),
    };

    let lines: Vec<&str> = text
        .split('\n')
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .collect();
    let opens = lines.first().is_some_and(|line| line.trim() == "---");
    if !opens {
        return stopped(located(
            ParseErrorKind::Frontmatter,
            "file must begin with a --- frontmatter delimiter",
            1,
            1,
        ));
    }
    let Some(closing) = lines
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, line)| line.trim() == "---")
        .map(|(index, _)| index)
    else {
        return stopped(located(
            ParseErrorKind::Frontmatter,
            "frontmatter was not closed with ---",
            1,
            1,
        ));
    };

    // The frontmatter first; whatever it holds, the body is checked too.
    let mut diagnostics: Vec<Diagnostic> = Vec::new();
    let yaml_text = lines.get(1..closing).unwrap_or_default().join("\n");
    let (frontmatter, version_key) = match yaml::parse_document(&yaml_text, 2) {
        Ok(document) => {
            let top = yaml::Mark { line: 2, column: 1 };
            let (frontmatter, version_key) =
                frontmatter::build(document.as_ref(), top, &mut diagnostics);
            (frontmatter, Some(version_key))
        }
        Err(e) => {
            diagnostics.push(Diagnostic::error(frontmatter::fm_error(
                e.detail,
                Some(e.mark),
            )));
            (Frontmatter::default(), None)
        }
    };
    let frontmatter_ok = diagnostics.is_empty();

    let body_lines: Vec<body::BodyLine<'_>> = lines
        .iter()
        .enumerate()
        .skip(closing + 1)
        .map(|(index, text)| body::BodyLine {
            number: u32::try_from(index + 1).unwrap_or(u32::MAX),
            text,
        })
        .collect();
    let (parts, unclosed) = body::parse_body(&body_lines, &mut diagnostics);
    let blocks = lua_check::all_blocks(parts.shared.as_ref(), &parts.h1_blocks, &parts.sections);
    lua_check::compile_all(&blocks, &unclosed, &mut diagnostics);

    let prompt_name = frontmatter_ok.then(|| frontmatter.name.clone());
    let version = frontmatter.version.clone();
    Analysis {
        prompt: Some(Prompt {
            frontmatter,
            title: parts.title,
            title_line: parts.title_line,
            shared: parts.shared,
            h1_blocks: parts.h1_blocks,
            sections: parts.sections,
        }),
        diagnostics,
        prompt_name,
        version_key,
        version,
    }
}
