//! Every problem the parser can find in one pass, located in the prompt file,
//! and the two ways a host prints them: one line (`FILE:LINE:COL: Kind:
//! message`) and a rustc-style snippet. Pure: no I/O, never panics.

use crate::ast::{ParseError, ParseErrorKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// The five parse error kinds, plus `Version`: the run error kind a declared
/// major other than 0 fails with (the file parses, but `run` refuses it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagnosticKind {
    Frontmatter,
    Structure,
    Fence,
    List,
    Lua,
    Version,
}

impl DiagnosticKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DiagnosticKind::Frontmatter => "Frontmatter",
            DiagnosticKind::Structure => "Structure",
            DiagnosticKind::Fence => "Fence",
            DiagnosticKind::List => "List",
            DiagnosticKind::Lua => "Lua",
            DiagnosticKind::Version => "Version",
        }
    }

    /// The parse error kind, `None` for `Version` (not a parse failure).
    pub fn parse_kind(self) -> Option<ParseErrorKind> {
        match self {
            DiagnosticKind::Frontmatter => Some(ParseErrorKind::Frontmatter),
            DiagnosticKind::Structure => Some(ParseErrorKind::Structure),
            DiagnosticKind::Fence => Some(ParseErrorKind::Fence),
            DiagnosticKind::List => Some(ParseErrorKind::List),
            DiagnosticKind::Lua => Some(ParseErrorKind::Lua),
            DiagnosticKind::Version => None,
        }
    }
}

impl From<ParseErrorKind> for DiagnosticKind {
    fn from(kind: ParseErrorKind) -> Self {
        match kind {
            ParseErrorKind::Frontmatter => DiagnosticKind::Frontmatter,
            ParseErrorKind::Structure => DiagnosticKind::Structure,
            ParseErrorKind::Fence => DiagnosticKind::Fence,
            ParseErrorKind::List => DiagnosticKind::List,
            ParseErrorKind::Lua => DiagnosticKind::Lua,
        }
    }
}

/// One problem. `line`/`column` are 1-based and absolute in the prompt file
/// (the opening `---` is line 1; the column counts bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub kind: DiagnosticKind,
    /// Byte for byte the message `parse` (or `run`) gives for this problem.
    pub message: String,
    pub line: Option<u32>,
    pub column: Option<u32>,
    /// How many bytes from `column` the problem covers, when known.
    pub span_len: Option<u32>,
    /// A suggestion, e.g. "did you mean `description`?".
    pub help: Option<String>,
    /// Extra context, e.g. where a Lua compile error sits inside its block.
    pub note: Option<String>,
    /// Whether `parse` reports this location too: a Lua compile error's
    /// position lives in its message (guide ch. 17), so `parse` gives none.
    parse_reports_location: bool,
}

impl Diagnostic {
    pub(crate) fn error(error: ParseError) -> Self {
        Diagnostic {
            severity: Severity::Error,
            kind: error.kind.into(),
            message: error.message,
            line: error.line,
            column: error.column,
            span_len: None,
            help: None,
            note: None,
            parse_reports_location: true,
        }
    }

    pub(crate) fn with_help(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }

    pub(crate) fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    pub(crate) fn with_span(mut self, len: usize) -> Self {
        self.span_len = u32::try_from(len).ok().filter(|len| *len > 0);
        self
    }

    /// Locates a diagnostic where `parse` reports no location.
    pub(crate) fn located_beyond_parse(mut self, line: u32, column: u32) -> Self {
        self.line = Some(line);
        self.column = Some(column);
        self.parse_reports_location = false;
        self
    }

    pub(crate) fn with_kind(mut self, kind: DiagnosticKind) -> Self {
        self.kind = kind;
        self
    }

    /// The error `parse` returns for this problem, `None` for a warning or a
    /// `Version` diagnostic. A not-a-prompt diagnostic gives the `Structure`
    /// error `run` reports, without a location.
    pub fn to_parse_error(&self) -> Option<ParseError> {
        if self.severity != Severity::Error {
            return None;
        }
        let (line, column) = if self.parse_reports_location {
            (self.line, self.column)
        } else {
            (None, None)
        };
        Some(ParseError {
            kind: self.kind.parse_kind()?,
            message: self.message.clone(),
            line,
            column,
        })
    }

    /// The `--json` form: `severity`, `kind`, `message`, `file`, and `line`,
    /// `column`, `span_len`, `help`, `note` when known.
    pub fn to_json(&self, file_name: &str) -> serde_json::Value {
        diagnostic_json(
            self.severity,
            self.kind.as_str(),
            &self.message,
            file_name,
            DiagnosticPlace {
                line: self.line,
                column: self.column,
                span_len: self.span_len,
                help: self.help.as_deref(),
                note: self.note.as_deref(),
            },
        )
    }

    /// `FILE:LINE:COL: Kind: message`, the `check` line (1:1 when unlocated).
    pub fn one_line(&self, file_name: &str) -> String {
        format!(
            "{file_name}:{}:{}: {}: {}",
            self.line.unwrap_or(1),
            self.column.unwrap_or(1),
            self.kind.as_str(),
            self.message
        )
    }
}

/// Every problem of one prompt file, in the order `parse` meets them: the
/// frontmatter, the body structure, fences, lists, Lua blocks, and then the
/// version rule `run` applies to a file that parses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics {
    pub diagnostics: Vec<Diagnostic>,
}

impl Diagnostics {
    pub fn has_errors(&self) -> bool {
        self.errors().next().is_some()
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Warning)
    }

    /// The first error: the one `parse` returns, or else the one `run`
    /// refuses the file with (not a prompt, unsupported major).
    pub fn first_error(&self) -> Option<&Diagnostic> {
        self.errors().next()
    }

    pub fn is_empty(&self) -> bool {
        self.diagnostics.is_empty()
    }

    pub fn len(&self) -> usize {
        self.diagnostics.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.diagnostics.iter()
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.diagnostics.iter()
    }
}

/// Levenshtein distance over chars (inputs are short keys).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            let insert = current[j] + 1;
            let delete = previous[j + 1] + 1;
            current.push(substitute.min(insert).min(delete));
        }
        previous = current;
    }
    previous.last().copied().unwrap_or(0)
}

/// The known word nearest to `word`, when it is close enough to be a slip.
pub(crate) fn nearest<'k>(word: &str, known: &[&'k str]) -> Option<&'k str> {
    let lowered = word.to_lowercase();
    let allowed = (word.chars().count() / 3).max(2);
    known
        .iter()
        .map(|k| (edit_distance(&lowered, k), *k))
        .filter(|(distance, k)| *distance <= allowed && *distance < k.chars().count())
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

/// The prompt-file line `line` (1-based) without its line ending, if any.
fn source_line(source: &str, line: u32) -> Option<&str> {
    let index = usize::try_from(line).ok()?.checked_sub(1)?;
    source
        .split('\n')
        .nth(index)
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
}

fn floor_char_boundary(text: &str, mut index: usize) -> usize {
    index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// A rustc-style report of one diagnostic:
///
/// ```text
/// error[Frontmatter]: invalid frontmatter: unknown field `descripton`, ...
///  --> prompt.md:3:1
///   |
/// 3 | descripton: d
///   | ^^^^^^^^^^
///   |
///   = help: did you mean `description`?
/// ```
///
/// `source` is the prompt file as read (invalid UTF-8 is shown replaced);
/// ANSI colour only when `color`.
pub fn render_diagnostic(
    file_name: &str,
    source: &[u8],
    diagnostic: &Diagnostic,
    color: bool,
) -> String {
    use annotate_snippets::{Level, Renderer, Snippet};
    let text = String::from_utf8_lossy(source);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    // `origin` alone gives `--> FILE`; with a line the snippet prints it.
    let origin_only = match diagnostic.line {
        Some(line) => format!("{file_name}:{line}"),
        None => file_name.to_string(),
    };
    let level = match diagnostic.severity {
        Severity::Error => Level::Error,
        Severity::Warning => Level::Warning,
    };
    let mut message = level
        .title(&diagnostic.message)
        .id(diagnostic.kind.as_str());
    let line_text = diagnostic.line.and_then(|line| source_line(text, line));
    if let (Some(line), Some(line_text)) = (diagnostic.line, line_text) {
        let column = diagnostic.column.unwrap_or(1).max(1) as usize;
        let start = floor_char_boundary(line_text, column - 1);
        let wanted = diagnostic.span_len.unwrap_or(1).max(1) as usize;
        let mut end = floor_char_boundary(line_text, start.saturating_add(wanted));
        if end == start {
            // At least one character, when the line has one there.
            end = line_text[start..]
                .char_indices()
                .nth(1)
                .map(|(i, _)| start + i)
                .unwrap_or(line_text.len());
        }
        message = message.snippet(
            Snippet::source(line_text)
                .line_start(line as usize)
                .origin(file_name)
                .annotation(level.span(start..end)),
        );
    }
    if let Some(note) = &diagnostic.note {
        message = message.footer(Level::Note.title(note));
    }
    if let Some(help) = &diagnostic.help {
        message = message.footer(Level::Help.title(help));
    }
    let renderer = if color {
        Renderer::styled()
    } else {
        Renderer::plain()
    };
    let rendered = renderer.render(message).to_string();
    if line_text.is_some() && diagnostic.line.is_some() {
        return rendered;
    }
    // No line to show: the title, then where, then any footers.
    let (title, rest) = rendered.split_once('\n').unwrap_or((&rendered, ""));
    let mut out = format!("{title}\n --> {origin_only}");
    if !rest.is_empty() {
        out.push('\n');
        out.push_str(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_key_suggestions() {
        let keys = ["name", "description", "promptforge", "args", "tools"];
        assert_eq!(nearest("descripton", &keys), Some("description"));
        assert_eq!(nearest("Name", &keys), Some("name"));
        assert_eq!(nearest("promptforg", &keys), Some("promptforge"));
        assert_eq!(nearest("tool", &keys), Some("tools"));
        assert_eq!(nearest("zzzz", &keys), None);
        assert_eq!(nearest("", &keys), None);
    }
}

/// Where a diagnostic points and what it adds, each part optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct DiagnosticPlace<'a> {
    pub line: Option<u32>,
    pub column: Option<u32>,
    pub span_len: Option<u32>,
    pub help: Option<&'a str>,
    pub note: Option<&'a str>,
}

/// The one `--json` shape of a diagnostic, for the parser's and for any
/// other check's: `severity`, `kind`, `message`, `file`, then `line`,
/// `column`, `span_len`, `help`, `note` when known.
pub fn diagnostic_json(
    severity: Severity,
    kind: &str,
    message: &str,
    file_name: &str,
    place: DiagnosticPlace<'_>,
) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    object.insert("severity".into(), severity.as_str().into());
    object.insert("kind".into(), kind.into());
    object.insert("message".into(), message.into());
    object.insert("file".into(), file_name.into());
    let optional = [
        ("line", place.line.map(serde_json::Value::from)),
        ("column", place.column.map(serde_json::Value::from)),
        ("span_len", place.span_len.map(serde_json::Value::from)),
        ("help", place.help.map(serde_json::Value::from)),
        ("note", place.note.map(serde_json::Value::from)),
    ];
    for (key, value) in optional {
        if let Some(value) = value {
            object.insert(key.into(), value);
        }
    }
    serde_json::Value::Object(object)
}
