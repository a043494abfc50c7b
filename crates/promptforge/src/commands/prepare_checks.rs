//! The checks `check` makes beyond the parser: the ones prepare would make
//! against a host (required Plugins offered and activating, tool slot paths
//! among their real tools) and static ones over the prompt (literal heading
//! targets of `jump`/`call`/`fanout`/`tasks.spawn`, literal role labels,
//! `input:`/`output:` path rules). Nothing here runs a prompt.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use pf_harness::{ActivationContext, CancellationToken};
use pf_syntax::{Block, Diagnostic, LuaBlock, Prompt, Section, Severity};

use pf_host::HostConfig;

/// One problem `check` reports: a parser diagnostic, or one found here.
#[derive(Debug, Clone)]
pub struct Problem {
    pub severity: Severity,
    /// A parse error kind, `Version`, or the run error kind the problem would
    /// end a run with (`RequirementsUnmet`, `Binding`, `Lua`, `Store`).
    pub kind: String,
    pub message: String,
    pub line: Option<u32>,
    pub column: Option<u32>,
    pub span_len: Option<u32>,
    pub help: Option<String>,
    pub note: Option<String>,
    /// The parser's own diagnostic, rendered by pf-syntax's renderer.
    syntax: Option<Diagnostic>,
}

impl Problem {
    pub fn from_syntax(d: &Diagnostic) -> Problem {
        Problem {
            severity: d.severity,
            kind: d.kind.as_str().to_string(),
            message: d.message.clone(),
            line: d.line,
            column: d.column,
            span_len: d.span_len,
            help: d.help.clone(),
            note: d.note.clone(),
            syntax: Some(d.clone()),
        }
    }

    fn new(severity: Severity, kind: &str, message: String, line: u32, column: u32) -> Problem {
        Problem {
            severity,
            kind: kind.to_string(),
            message,
            line: Some(line),
            column: Some(column),
            span_len: None,
            help: None,
            note: None,
            syntax: None,
        }
    }

    fn span(mut self, len: usize) -> Problem {
        self.span_len = u32::try_from(len).ok().filter(|l| *l > 0);
        self
    }

    fn help(mut self, help: Option<String>) -> Problem {
        self.help = help;
        self
    }

    fn note(mut self, note: Option<String>) -> Problem {
        self.note = note;
        self
    }

    /// `FILE:LINE:COL: Kind: message` for an error; a warning says so:
    /// `FILE:LINE:COL: warning: Kind: message`.
    pub fn one_line(&self, file: &str) -> String {
        let (line, column) = (self.line.unwrap_or(1), self.column.unwrap_or(1));
        let base = match self.severity {
            Severity::Error => format!("{file}:{line}:{column}: {}: {}", self.kind, self.message),
            Severity::Warning => format!(
                "{file}:{line}:{column}: warning: {}: {}",
                self.kind, self.message
            ),
        };
        // The suggestion is the fix: it stays on the one line too.
        match &self.help {
            Some(help) => format!("{base} ({help})"),
            None => base,
        }
    }

    /// The `--json` form: `severity`, `kind`, `message`, `file`, then `line`,
    /// `column`, `span_len`, `help`, `note` when known.
    pub fn to_json(&self, file: &str) -> serde_json::Value {
        if let Some(d) = &self.syntax {
            return d.to_json(file);
        }
        pf_syntax::diagnostic_json(
            self.severity,
            &self.kind,
            &self.message,
            file,
            pf_syntax::DiagnosticPlace {
                line: self.line,
                column: self.column,
                span_len: self.span_len,
                help: self.help.as_deref(),
                note: self.note.as_deref(),
            },
        )
    }

    /// A rustc-style snippet.
    pub fn render(&self, file: &str, source: &[u8], color: bool) -> String {
        if let Some(d) = &self.syntax {
            return pf_syntax::render_diagnostic(file, source, d, color);
        }
        let text = String::from_utf8_lossy(source);
        render_snippet(
            &SnippetParts {
                severity: self.severity,
                kind: &self.kind,
                message: &self.message,
                file,
                line: self.line,
                column: self.column,
                span_len: self.span_len,
                help: self.help.as_deref(),
                note: self.note.as_deref(),
            },
            &text,
            color,
        )
    }
}

/// What [`render_snippet`] shows.
pub struct SnippetParts<'a> {
    pub severity: Severity,
    pub kind: &'a str,
    pub message: &'a str,
    pub file: &'a str,
    pub line: Option<u32>,
    pub column: Option<u32>,
    pub span_len: Option<u32>,
    pub help: Option<&'a str>,
    pub note: Option<&'a str>,
}

/// The rustc-style layout for problems the parser does not report (and for
/// `run`'s runtime errors): `error[Kind]: message`, `  --> FILE:LINE:COL`, the
/// line with a caret, then `= help:`/`= note:` lines.
pub fn render_snippet(parts: &SnippetParts<'_>, source: &str, color: bool) -> String {
    let paint = |code: &str, text: &str| {
        if color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    };
    let (label, code) = match parts.severity {
        Severity::Error => ("error", "1;31"),
        Severity::Warning => ("warning", "1;33"),
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "{}{}",
        paint(code, &format!("{label}[{}]", parts.kind)),
        paint("1", &format!(": {}", parts.message))
    );
    let Some(line) = parts.line else {
        let _ = write!(out, "\n{} {}", paint("1;34", "  -->"), parts.file);
        return out;
    };
    let gutter = line.to_string().len();
    let pad = " ".repeat(gutter);
    let location = match parts.column {
        Some(column) => format!("{}:{line}:{column}", parts.file),
        None => format!("{}:{line}", parts.file),
    };
    let _ = write!(out, "\n{pad}{} {location}", paint("1;34", "-->"));
    let line_text = source
        .split('\n')
        .nth(line.saturating_sub(1) as usize)
        .map(|l| l.strip_suffix('\r').unwrap_or(l));
    if let Some(line_text) = line_text {
        let bar = paint("1;34", "|");
        let _ = write!(out, "\n{pad} {bar}");
        let _ = write!(
            out,
            "\n{} {bar} {}",
            paint("1;34", &line.to_string()),
            line_text
        );
        if let Some(column) = parts.column {
            let before: String = line_text
                .chars()
                .take(column.saturating_sub(1) as usize)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            let carets = "^".repeat(parts.span_len.unwrap_or(1).max(1) as usize);
            let _ = write!(out, "\n{pad} {bar} {before}{}", paint(code, &carets));
        }
    }
    for (what, text) in [("help", parts.help), ("note", parts.note)] {
        if let Some(text) = text {
            let _ = write!(out, "\n{pad} {} {what}: {text}", paint("1;34", "="));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Static checks: no host needed
// ---------------------------------------------------------------------------

/// Literal heading targets, literal role labels and the `input:`/`output:`
/// path rules.
pub fn static_problems(prompt: &Prompt, text: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (decl, key) in [
        (prompt.frontmatter.input.as_ref(), "input"),
        (prompt.frontmatter.output.as_ref(), "output"),
    ] {
        let Some(decl) = decl else { continue };
        if let Err(e) = pf_store::validate_path(&decl.path) {
            let (line, column) = frontmatter_value_at(text, &decl.path).unwrap_or((1, 1));
            problems.push(
                Problem::new(
                    Severity::Error,
                    "Store",
                    format!("`{key}:` {}", e.message),
                    line,
                    column,
                )
                .span(decl.path.len())
                .help(Some(
                    "a store path is relative, uses `/`, and has no `..` or empty segments"
                        .to_string(),
                )),
            );
        }
    }
    let labels: Vec<&str> = prompt
        .frontmatter
        .models
        .iter()
        .map(|r| r.label.as_str())
        .collect();
    for (caller, block) in lua_blocks(prompt) {
        for call in literal_calls(block) {
            match call.function {
                Callee::Heading(name) => {
                    if let Some(p) = heading_problem(prompt, &caller, name, &call) {
                        problems.push(p);
                    }
                }
                Callee::UseRole | Callee::GetModel => {
                    if labels.contains(&call.literal.as_str()) {
                        continue;
                    }
                    let (severity, message) = if call.function == Callee::UseRole {
                        (
                            Severity::Error,
                            format!(
                                "models.use('{}'): role `{}` is not declared in `models:`",
                                call.literal, call.literal
                            ),
                        )
                    } else {
                        // models.get also takes catalog ids, which only the host knows.
                        (
                            Severity::Warning,
                            format!("models.get('{}'): `{}` is not a role declared in `models:` (fine if it is a catalog model id)", call.literal, call.literal),
                        )
                    };
                    let help = nearest(&call.literal, &labels)
                        .map(|n| format!("did you mean `{n}`?"))
                        .or_else(|| {
                            (call.function == Callee::UseRole).then(|| {
                                format!("declare it: `models:\\n  {}: {{}}`", call.literal)
                            })
                        });
                    problems.push(
                        Problem::new(severity, "Binding", message, call.line, call.column)
                            .span(call.literal.len() + 2)
                            .help(help),
                    );
                }
            }
        }
    }
    problems
}

fn heading_problem(
    prompt: &Prompt,
    caller: &[usize],
    function: &str,
    call: &LiteralCall,
) -> Option<Problem> {
    let target = call.literal.trim();
    // A bare name is a tool name for `call` (tools), not a heading.
    if !target.starts_with('#') {
        return None;
    }
    let message = match pf_syntax::resolve_heading(prompt, caller, target) {
        Ok(_) => return None,
        Err(message) => message,
    };
    let exists_anywhere = pf_syntax::parse_heading_ref(target).is_ok_and(|r| {
        all_sections(&prompt.sections)
            .iter()
            .any(|s| s.level as usize == r.level && s.name == r.name)
    });
    // Visibility depends on where a shared function is called from, so a
    // heading that exists elsewhere is only a warning.
    let severity = if exists_anywhere {
        Severity::Warning
    } else {
        Severity::Error
    };
    let names: Vec<String> = all_sections(&prompt.sections)
        .iter()
        .map(|s| pf_syntax::heading_of(s))
        .collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let help = nearest(target, &name_refs).map(|n| format!("did you mean `{n}`?"));
    Some(
        Problem::new(
            severity,
            "Lua",
            format!("{function}('{target}'): {message}"),
            call.line,
            call.column,
        )
        .span(call.literal.len() + 2)
        .help(help),
    )
}

fn all_sections(sections: &[Section]) -> Vec<&Section> {
    let mut out = Vec::new();
    for s in sections {
        out.push(s);
        out.extend(all_sections(&s.children));
    }
    out
}

/// Every Lua block with the index path of its section (empty for the H1 body
/// and the shared library).
fn lua_blocks(prompt: &Prompt) -> Vec<(Vec<usize>, &LuaBlock)> {
    fn walk<'p>(
        sections: &'p [Section],
        path: &mut Vec<usize>,
        out: &mut Vec<(Vec<usize>, &'p LuaBlock)>,
    ) {
        for (i, s) in sections.iter().enumerate() {
            path.push(i);
            for b in &s.blocks {
                if let Block::Lua(l) = b {
                    out.push((path.clone(), l));
                }
            }
            walk(&s.children, path, out);
            path.pop();
        }
    }
    let mut out = Vec::new();
    if let Some(shared) = &prompt.shared {
        out.push((Vec::new(), shared));
    }
    for b in &prompt.h1_blocks {
        if let Block::Lua(l) = b {
            out.push((Vec::new(), l));
        }
    }
    walk(&prompt.sections, &mut Vec::new(), &mut out);
    out
}

/// Where a frontmatter value is written: the first line holding it.
fn frontmatter_value_at(text: &str, value: &str) -> Option<(u32, u32)> {
    text.split('\n').enumerate().skip(1).find_map(|(i, line)| {
        let col = line.find(value)?;
        Some((u32::try_from(i + 1).ok()?, u32::try_from(col + 1).ok()?))
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Callee {
    /// `jump`, `call`, `fanout`, `tasks.spawn`: the function's name.
    Heading(&'static str),
    UseRole,
    GetModel,
}

#[derive(Debug)]
struct LiteralCall {
    function: Callee,
    literal: String,
    /// Absolute prompt-file position of the string literal.
    line: u32,
    column: u32,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Name(String),
    Str(String),
    Punct(char),
}

/// A small Lua tokenizer: names, string literals (quoted and long), single
/// punctuation; comments and numbers skipped. Enough to find `f('literal')`.
fn tokens(source: &str) -> Vec<(Token, u32, u32)> {
    let bytes = source.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line, mut line_start) = (0usize, 0u32, 0usize);
    let long_bracket = |at: usize| -> Option<usize> {
        // `[` `=`* `[`: the level (count of `=`).
        if bytes.get(at) != Some(&b'[') {
            return None;
        }
        let mut j = at + 1;
        while bytes.get(j) == Some(&b'=') {
            j += 1;
        }
        (bytes.get(j) == Some(&b'[')).then_some(j - at - 1)
    };
    let skip_long = |from: usize, level: usize, line: &mut u32, line_start: &mut usize| -> usize {
        let close = format!("]{}]", "=".repeat(level));
        let mut j = from;
        while j < bytes.len() {
            if bytes[j] == b'\n' {
                *line += 1;
                *line_start = j + 1;
            }
            if source[j..].starts_with(&close) {
                return j + close.len();
            }
            j += 1;
        }
        bytes.len()
    };
    while i < bytes.len() {
        let c = bytes[i];
        match c {
            b'\n' => {
                line += 1;
                line_start = i + 1;
                i += 1;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                if let Some(level) = long_bracket(i + 2) {
                    i = skip_long(i + 4 + level, level, &mut line, &mut line_start);
                } else {
                    while i < bytes.len() && bytes[i] != b'\n' {
                        i += 1;
                    }
                }
            }
            b'"' | b'\'' => {
                let (start_line, start_col) = (line, (i - line_start) as u32);
                let mut value = String::new();
                let mut j = i + 1;
                while j < bytes.len() && bytes[j] != c && bytes[j] != b'\n' {
                    if bytes[j] == b'\\' {
                        j += 1;
                        value.push('\u{FFFD}');
                    } else if let Some(ch) = source[j..].chars().next() {
                        value.push(ch);
                        j += ch.len_utf8() - 1;
                    }
                    j += 1;
                }
                out.push((Token::Str(value), start_line, start_col));
                i = j + 1;
            }
            b'[' if long_bracket(i).is_some() => {
                let level = long_bracket(i).unwrap_or(0);
                let (start_line, start_col) = (line, (i - line_start) as u32);
                let body_start = i + 2 + level;
                let end = skip_long(body_start, level, &mut line, &mut line_start);
                let body_end = end.saturating_sub(2 + level).max(body_start);
                let body = source.get(body_start..body_end).unwrap_or_default();
                out.push((Token::Str(body.to_string()), start_line, start_col));
                i = end;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let col = (start - line_start) as u32;
                out.push((Token::Name(source[start..i].to_string()), line, col));
            }
            c if c.is_ascii_digit() => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                    i += 1;
                }
            }
            c if c.is_ascii_whitespace() => i += 1,
            c if c.is_ascii() => {
                out.push((Token::Punct(c as char), line, (i - line_start) as u32));
                i += 1;
            }
            _ => i += source[i..].chars().next().map(char::len_utf8).unwrap_or(1),
        }
    }
    out
}

/// `jump '## X'`, `call('## X', …)`, `fanout('### W', …)`,
/// `tasks.spawn('### J', …)`, `models.use('r')`, `models.get('r')`.
fn literal_calls(block: &LuaBlock) -> Vec<LiteralCall> {
    let toks = tokens(&block.source);
    let mut out = Vec::new();
    let name_at = |i: usize| match toks.get(i) {
        Some((Token::Name(n), _, _)) => Some(n.as_str()),
        _ => None,
    };
    let punct_at =
        |i: usize, p: char| matches!(toks.get(i), Some((Token::Punct(c), _, _)) if *c == p);
    for i in 0..toks.len() {
        let Some(name) = name_at(i) else { continue };
        let after_dot = i > 0 && (punct_at(i - 1, '.') || punct_at(i - 1, ':'));
        let (callee, next) = match name {
            "jump" | "call" | "fanout" if !after_dot => {
                let f = match name {
                    "jump" => "jump",
                    "call" => "call",
                    _ => "fanout",
                };
                (Callee::Heading(f), i + 1)
            }
            "tasks" if !after_dot && punct_at(i + 1, '.') && name_at(i + 2) == Some("spawn") => {
                (Callee::Heading("tasks.spawn"), i + 3)
            }
            "models" if !after_dot && punct_at(i + 1, '.') && name_at(i + 2) == Some("use") => {
                (Callee::UseRole, i + 3)
            }
            "models" if !after_dot && punct_at(i + 1, '.') && name_at(i + 2) == Some("get") => {
                (Callee::GetModel, i + 3)
            }
            _ => continue,
        };
        let literal_at = if punct_at(next, '(') { next + 1 } else { next };
        if let Some((Token::Str(value), line, col)) = toks.get(literal_at) {
            out.push(LiteralCall {
                function: callee,
                literal: value.clone(),
                line: block.first_line + line,
                column: col + 1,
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Host checks: what prepare would find
// ---------------------------------------------------------------------------

/// What the host's Plugins offer: per Plugin id, its tools, or why it could
/// not be activated (`None`: the host does not offer that id).
#[derive(Debug, Default)]
pub struct OfferedTools {
    pub plugins: BTreeMap<String, Result<Vec<String>, String>>,
    /// Every Plugin id the host registers.
    pub registered: Vec<String>,
}

/// Activate each Plugin the files declare (once each, with its first
/// declaration's `config:`), list its tools, and shut it down again.
pub async fn offered_tools(
    host: &HostConfig,
    files: &[std::path::PathBuf],
) -> Result<OfferedTools, pf_host::HostError> {
    // Only the Plugins matter here; no model is started.
    let assembled = host.assemble(None)?;
    let harness = assembled.harness;
    let mut offered = OfferedTools {
        registered: harness.ids().map(str::to_string).collect(),
        ..OfferedTools::default()
    };
    let mut wanted: BTreeMap<String, Option<serde_json::Value>> = BTreeMap::new();
    for file in files {
        let Ok(source) = pf_host::prompt_files::read_prompt(file) else {
            continue;
        };
        let Ok(prompt) = pf_syntax::parse(&source) else {
            continue;
        };
        for decl in &prompt.frontmatter.plugins {
            wanted.entry(decl.id.clone()).or_insert(decl.config.clone());
        }
    }
    let store = std::env::temp_dir().join(format!("promptforge-check-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&store);
    for (id, config) in wanted {
        let Some(plugin) = harness.get(&id) else {
            continue;
        };
        let cancel = CancellationToken::new();
        let ctx = ActivationContext {
            store_dir: store.clone(),
            cancel: cancel.clone(),
            services: harness.services.clone(),
            config,
        };
        let listed = match plugin.activate(ctx).await {
            Ok(active) => {
                let tools = active.tools().into_iter().map(|t| t.path).collect();
                active.shutdown().await;
                Ok(tools)
            }
            Err(why) => Err(why),
        };
        cancel.cancel();
        tracing::info!(plugin = %id, ok = listed.is_ok(), "check activated a Plugin to list its tools");
        offered.plugins.insert(id, listed);
    }
    let _ = std::fs::remove_dir_all(&store);
    Ok(offered)
}

/// Required Plugins the host lacks or cannot activate, tool slot paths that
/// are not among their Plugins' tools, and roles the current model cannot meet.
pub fn host_problems(
    prompt: &Prompt,
    text: &str,
    host: &HostConfig,
    offered: &OfferedTools,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    for decl in &prompt.frontmatter.plugins {
        let severity = if decl.optional {
            Severity::Warning
        } else {
            Severity::Error
        };
        let adjective = if decl.optional {
            "optional"
        } else {
            "required"
        };
        let message = match offered.plugins.get(&decl.id) {
            Some(Ok(_)) => continue,
            Some(Err(why)) => format!("{adjective} Plugin {} failed to activate: {why}", decl.id),
            None => format!("{adjective} Plugin {} is not offered by the host", decl.id),
        };
        let registered: Vec<&str> = offered.registered.iter().map(String::as_str).collect();
        let help = nearest(&decl.id, &registered)
            .map(|n| format!("did you mean `{n}`?"))
            .or_else(|| Some(format!("the host offers: {}", registered.join(", "))));
        problems.push(
            Problem::new(
                severity,
                "RequirementsUnmet",
                message,
                decl.line,
                decl.column,
            )
            .span(decl.id.len())
            .help(help),
        );
    }
    for slot in &prompt.frontmatter.tools {
        let Some(Ok(tools)) = offered.plugins.get(slot.plugin_id()) else {
            continue;
        };
        if tools.contains(&slot.path) {
            continue;
        }
        let names: Vec<&str> = tools.iter().map(String::as_str).collect();
        problems.push(
            Problem::new(
                Severity::Error,
                "Binding",
                format!(
                    "tool slot `{}`: Plugin {} has no tool {}",
                    slot.alias,
                    slot.plugin_id(),
                    slot.path
                ),
                slot.line,
                slot.column,
            )
            .span(slot.path.len())
            .help(nearest(&slot.path, &names).map(|n| format!("did you mean `{n}`?")))
            .note(Some(if names.is_empty() {
                format!("Plugin {} offers no tools", slot.plugin_id())
            } else {
                format!("Plugin {} offers: {}", slot.plugin_id(), names.join(", "))
            })),
        );
    }
    let current = host
        .current_id(pf_host::chosen_model(None).as_deref())
        .ok()
        .flatten();
    if let Some(model) = current.as_deref().and_then(|id| host.spec(id)) {
        for role in &prompt.frontmatter.models {
            let mut unmet = Vec::new();
            if let Some(min) = role.min_context {
                if model.context < min {
                    unmet.push(format!(
                        "requires a context of at least {min} tokens; the current model provides {}",
                        model.context
                    ));
                }
            }
            for keyword in &role.keywords {
                let thinking = model.thinking;
                let bad = match keyword.as_str() {
                    "thinking" => thinking == pf_harness::ThinkingSupport::Never,
                    "no-thinking" => thinking == pf_harness::ThinkingSupport::Always,
                    _ => false,
                };
                if bad {
                    unmet.push(format!(
                        "requires '{keyword}'; the current model ({}) does not offer it",
                        model.model
                    ));
                }
            }
            for why in unmet {
                let (line, column) =
                    frontmatter_value_at(text, &format!("{}:", role.label)).unwrap_or((1, 1));
                problems.push(Problem::new(
                    Severity::Error,
                    "RequirementsUnmet",
                    format!("role '{}': {why}", role.label),
                    line,
                    column,
                ));
            }
        }
    }
    problems
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current.push(substitute.min(current[j] + 1).min(previous[j + 1] + 1));
        }
        previous = current;
    }
    previous.last().copied().unwrap_or(0)
}

/// The candidate nearest to `word`, when close enough to be a slip.
pub fn nearest<'k>(word: &str, candidates: &[&'k str]) -> Option<&'k str> {
    let allowed = (word.chars().count() / 3).max(2);
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, c)| *d <= allowed && *d > 0 && *d < c.chars().count())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_calls_are_found_outside_comments_and_after_dots_are_not() {
        let block = LuaBlock {
            source: "-- jump('## Nope')\njump '## A'\ncall(\"## B\", 1)\ntools.call('x')\n\
                     tasks.spawn([[### C]])\nmodels.use('w')\n--[[ fanout('## D') ]]\n"
                .to_string(),
            first_line: 10,
            role: pf_syntax::BlockRole::Plain,
            label: "l".to_string(),
        };
        let found: Vec<(String, u32, u32)> = literal_calls(&block)
            .into_iter()
            .map(|c| (c.literal, c.line, c.column))
            .collect();
        assert_eq!(
            found,
            vec![
                ("## A".to_string(), 11, 6),
                ("## B".to_string(), 12, 6),
                ("### C".to_string(), 14, 13),
                ("w".to_string(), 15, 12),
            ]
        );
    }

    #[test]
    fn nearest_suggests_slips_only() {
        assert_eq!(
            nearest(
                "promptforge/web/fetc",
                &["promptforge/web/fetch", "promptforge/web/search"]
            ),
            Some("promptforge/web/fetch")
        );
        assert_eq!(nearest("zzz", &["fetch"]), None);
    }
}
