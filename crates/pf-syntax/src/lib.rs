//! Parses promptforge prompt files: frontmatter, body, and a compile check of
//! every Lua block. Pure: no I/O, never panics on any input.

pub mod ast;
mod body;
mod frontmatter;
mod heading;
mod lua_check;
pub mod names;
mod yaml;

pub use ast::*;
pub use frontmatter::ROLE_KEYWORDS;
pub use heading::{heading_of, parse_heading_ref, resolve_heading, HeadingRef};
pub use names::{
    check_plugin_id, check_tool_path, is_reserved_name, is_valid_name, is_valid_segment,
    NAME_GRAMMAR, RESERVED_NAMES,
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
    let no_name = |error: ParseError| ParseFailure {
        error,
        prompt_name: None,
    };
    let source = source.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(source);
    let text =
        std::str::from_utf8(source).map_err(|e| no_name(utf8_failure(source, e.valid_up_to())))?;

    let lines: Vec<&str> = text
        .split('\n')
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
        .collect();
    let opens = lines.first().is_some_and(|line| line.trim() == "---");
    if !opens {
        return Err(no_name(located(
            ParseErrorKind::Frontmatter,
            "file must begin with a --- frontmatter delimiter",
            1,
            1,
        )));
    }
    let closing = lines
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, line)| line.trim() == "---")
        .map(|(index, _)| index)
        .ok_or_else(|| {
            no_name(located(
                ParseErrorKind::Frontmatter,
                "frontmatter was not closed with ---",
                1,
                1,
            ))
        })?;

    let yaml_text = lines.get(1..closing).unwrap_or_default().join("\n");
    let document = yaml::parse_document(&yaml_text, 2)
        .map_err(|e| no_name(frontmatter::fm_error(e.detail, Some(e.mark))))?;
    let top = yaml::Mark { line: 2, column: 1 };
    let frontmatter = frontmatter::build(document.as_ref(), top).map_err(no_name)?;

    let prompt_name = frontmatter.name.clone();
    let with_name = |error: ParseError| ParseFailure {
        error,
        prompt_name: Some(prompt_name.clone()),
    };
    let body_lines: Vec<body::BodyLine<'_>> = lines
        .iter()
        .enumerate()
        .skip(closing + 1)
        .map(|(index, text)| body::BodyLine {
            number: u32::try_from(index + 1).unwrap_or(u32::MAX),
            text,
        })
        .collect();
    let parts = body::parse_body(&body_lines).map_err(with_name)?;
    let prompt = Prompt {
        frontmatter,
        title: parts.title,
        title_line: parts.title_line,
        shared: parts.shared,
        h1_blocks: parts.h1_blocks,
        sections: parts.sections,
    };
    lua_check::compile_all(&prompt).map_err(with_name)?;
    Ok(prompt)
}
