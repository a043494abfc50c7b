//! The Markdown body: a line scanner that follows CommonMark's block rules as
//! far as they decide what is a heading, a thematic break, or code, plus the
//! line-exact `lua` fence rules; then the H1 title, the section tree, blocks
//! and their roles, list sections, and the body's parse errors.

use crate::ast::*;
use crate::diagnostics::Diagnostic;
use std::collections::{HashMap, HashSet};

/// One body line: its file line number and its text without the line ending.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLine<'a> {
    pub number: u32,
    pub text: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FenceClose {
    Exact,
    /// The source ran into another `lua` fence before an exact closing line.
    NotExact,
    Unclosed,
}

#[derive(Debug)]
struct Fence {
    shared: bool,
    open_line: u32,
    source: String,
    close: FenceClose,
    /// The closing line, or the last line of the file when unclosed.
    end_line: u32,
}

#[derive(Debug)]
enum Item<'a> {
    Text {
        line: u32,
        text: &'a str,
    },
    Break,
    Heading {
        level: u8,
        name: String,
        line: u32,
        column: u32,
    },
    Fence(Fence),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Paragraph {
    /// An ordinary paragraph: a `---` or `===` line under it makes a setext heading.
    Plain,
    /// A paragraph inside a list item or block quote: no setext heading.
    Nested,
}

enum State {
    Normal,
    CodeFence { marker: u8, length: usize },
    HtmlComment,
}

const LUA_OPEN: &str = "```lua";
const SHARED_OPEN: &str = "```lua shared";
const FENCE_CLOSE: &str = "```";

/// Columns of leading whitespace (tabs to the next multiple of 4) and the byte
/// length of that whitespace.
fn indentation(line: &str) -> (usize, usize) {
    let mut columns = 0;
    for (index, byte) in line.bytes().enumerate() {
        match byte {
            b' ' => columns += 1,
            b'\t' => columns += 4 - columns % 4,
            _ => return (columns, index),
        }
    }
    (columns, line.len())
}

fn atx_level(rest: &str) -> Option<u8> {
    let hashes = rest.bytes().take_while(|b| *b == b'#').count();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    match rest.as_bytes().get(hashes) {
        None | Some(b' ') | Some(b'\t') => Some(hashes as u8),
        _ => None,
    }
}

fn is_thematic_break(rest: &str) -> bool {
    let mut marker = None;
    let mut count = 0;
    for byte in rest.bytes() {
        match byte {
            b' ' | b'\t' => {}
            b'-' | b'*' | b'_' => {
                if marker.is_some_and(|m| m != byte) {
                    return false;
                }
                marker = Some(byte);
                count += 1;
            }
            _ => return false,
        }
    }
    count >= 3
}

fn setext_level(rest: &str) -> Option<u8> {
    let trimmed = rest.trim_end_matches([' ', '\t']);
    if trimmed.is_empty() {
        None
    } else if trimmed.bytes().all(|b| b == b'=') {
        Some(1)
    } else if trimmed.bytes().all(|b| b == b'-') {
        Some(2)
    } else {
        None
    }
}

fn code_fence_open(rest: &str) -> Option<(u8, usize)> {
    let marker = *rest.as_bytes().first()?;
    if marker != b'`' && marker != b'~' {
        return None;
    }
    let length = rest.bytes().take_while(|b| *b == marker).count();
    if length < 3 {
        return None;
    }
    if marker == b'`' && rest[length..].contains('`') {
        return None;
    }
    Some((marker, length))
}

fn closes_code_fence(line: &str, marker: u8, length: usize) -> bool {
    let (columns, bytes) = indentation(line);
    if columns > 3 {
        return false;
    }
    let rest = &line[bytes..];
    let run = rest.bytes().take_while(|b| *b == marker).count();
    run >= length && rest[run..].trim().is_empty()
}

/// Whether a line opens a list item or block quote (a paragraph started there
/// is nested, so a `---` under it is a thematic break, not a setext underline).
fn opens_container(rest: &str) -> bool {
    let bytes = rest.as_bytes();
    match bytes.first() {
        Some(b'>') => true,
        Some(b'-' | b'*' | b'+') => matches!(bytes.get(1), None | Some(b' ') | Some(b'\t')),
        Some(b'0'..=b'9') => {
            let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
            digits <= 9
                && matches!(bytes.get(digits), Some(b'.') | Some(b')'))
                && matches!(bytes.get(digits + 1), None | Some(b' ') | Some(b'\t'))
        }
        _ => false,
    }
}

/// The inline text of a heading: inline code keeps its text, other markup
/// keeps only its text, surrounding whitespace trimmed.
fn heading_text(markdown: &str) -> String {
    use pulldown_cmark::{Event, Parser, Tag, TagEnd};
    let mut text = String::new();
    let mut inside = false;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => inside = true,
            Event::End(TagEnd::Heading(_)) => inside = false,
            Event::Text(t) | Event::Code(t) if inside => text.push_str(&t),
            Event::SoftBreak | Event::HardBreak if inside => text.push(' '),
            _ => {}
        }
    }
    text.trim().to_string()
}

fn scan<'a>(lines: &[BodyLine<'a>]) -> Vec<Item<'a>> {
    let mut items: Vec<Item<'a>> = Vec::new();
    let mut state = State::Normal;
    let mut paragraph: Option<Paragraph> = None;
    let mut paragraph_start = 0usize;
    let mut seen_h1 = false;
    let mut index = 0;
    while let Some(line) = lines.get(index) {
        index += 1;
        let text = line.text;
        match state {
            State::CodeFence { marker, length } => {
                if closes_code_fence(text, marker, length) {
                    state = State::Normal;
                }
                items.push(Item::Text {
                    line: line.number,
                    text,
                });
                continue;
            }
            State::HtmlComment => {
                if text.contains("-->") {
                    state = State::Normal;
                }
                items.push(Item::Text {
                    line: line.number,
                    text,
                });
                continue;
            }
            State::Normal => {}
        }

        if text.trim().is_empty() {
            paragraph = None;
            items.push(Item::Text {
                line: line.number,
                text,
            });
            continue;
        }

        let shared = text == SHARED_OPEN;
        if shared || (text == LUA_OPEN && seen_h1) {
            let mut source_lines: Vec<&str> = Vec::new();
            let mut close = FenceClose::Unclosed;
            let mut end_line = line.number;
            let mut ran_into_fence = false;
            while let Some(inner) = lines.get(index) {
                index += 1;
                end_line = inner.number;
                if inner.text == FENCE_CLOSE {
                    close = if ran_into_fence {
                        FenceClose::NotExact
                    } else {
                        FenceClose::Exact
                    };
                    break;
                }
                if inner.text == LUA_OPEN || inner.text == SHARED_OPEN {
                    ran_into_fence = true;
                }
                source_lines.push(inner.text);
            }
            if close == FenceClose::Unclosed && ran_into_fence {
                close = FenceClose::NotExact;
            }
            items.push(Item::Fence(Fence {
                shared,
                open_line: line.number,
                source: source_lines.join("\n"),
                close,
                end_line,
            }));
            paragraph = None;
            continue;
        }

        let (columns, indent_bytes) = indentation(text);
        if columns >= 4 {
            // Indented code, or a continuation line of the open paragraph.
            items.push(Item::Text {
                line: line.number,
                text,
            });
            continue;
        }
        let rest = &text[indent_bytes..];
        let column = indent_bytes as u32 + 1;

        if let Some((marker, length)) = code_fence_open(rest) {
            state = State::CodeFence { marker, length };
            paragraph = None;
            items.push(Item::Text {
                line: line.number,
                text,
            });
            continue;
        }
        if let Some(comment) = rest.strip_prefix("<!--") {
            if !comment.contains("-->") {
                state = State::HtmlComment;
            }
            paragraph = None;
            items.push(Item::Text {
                line: line.number,
                text,
            });
            continue;
        }
        if let Some(level) = atx_level(rest) {
            paragraph = None;
            seen_h1 |= level == 1;
            items.push(Item::Heading {
                level,
                name: heading_text(rest),
                line: line.number,
                column,
            });
            continue;
        }
        if paragraph == Some(Paragraph::Plain) {
            if let Some(level) = setext_level(rest) {
                // The whole open paragraph becomes the heading's text.
                let (first_line, first_column) = match items.get(paragraph_start) {
                    Some(Item::Text { line, text }) => (*line, indentation(text).1 as u32 + 1),
                    _ => (line.number, column),
                };
                let content: Vec<&str> = items
                    .drain(paragraph_start..)
                    .filter_map(|item| match item {
                        Item::Text { text, .. } => Some(text.trim()),
                        _ => None,
                    })
                    .collect();
                let markdown = format!(
                    "{}\n{}",
                    content.join("\n"),
                    if level == 1 { "=" } else { "-" }
                );
                paragraph = None;
                seen_h1 |= level == 1;
                items.push(Item::Heading {
                    level,
                    name: heading_text(&markdown),
                    line: first_line,
                    column: first_column,
                });
                continue;
            }
        }
        if is_thematic_break(rest) {
            paragraph = None;
            items.push(Item::Break);
            continue;
        }
        match paragraph {
            None => {
                paragraph = Some(if opens_container(rest) {
                    Paragraph::Nested
                } else {
                    Paragraph::Plain
                });
                paragraph_start = items.len();
            }
            Some(Paragraph::Plain) if opens_container(rest) => {
                paragraph = Some(Paragraph::Nested);
            }
            Some(_) => {}
        }
        items.push(Item::Text {
            line: line.number,
            text,
        });
    }
    items
}

/// Where a `lua` fence sits in its section, which decides its label.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Position {
    Prologue,
    Epilog,
    Plain,
}

enum Draft<'i> {
    Prose(ProseBlock),
    Lua(&'i Fence, Position),
}

/// The pending prose of a run of items: the text below the last thematic
/// break, trimmed of blank lines around it, and whether the run held anything.
fn region_prose(items: &[&Item], gap_line: u32) -> (ProseBlock, bool) {
    let mut has_content = false;
    let mut start = 0;
    for (index, item) in items.iter().enumerate() {
        match item {
            Item::Break => {
                has_content = true;
                start = index + 1;
            }
            Item::Text { text, .. } if !text.trim().is_empty() => has_content = true,
            _ => {}
        }
    }
    let all_lines: Vec<(u32, &str)> = items
        .get(start..)
        .unwrap_or_default()
        .iter()
        .filter_map(|item| match item {
            Item::Text { line, text } => Some((*line, *text)),
            _ => None,
        })
        .collect();
    let first = all_lines
        .iter()
        .position(|(_, t)| !t.trim().is_empty())
        .unwrap_or(all_lines.len());
    let end = all_lines
        .iter()
        .rposition(|(_, t)| !t.trim().is_empty())
        .map(|i| i + 1)
        .unwrap_or(first);
    let lines = all_lines.get(first..end).unwrap_or_default();
    let line = lines.first().map(|(l, _)| *l).unwrap_or(gap_line);
    let text = lines.iter().map(|(_, t)| *t).collect::<Vec<_>>().join("\n");
    (ProseBlock { text, line }, has_content)
}

/// Splits a part (the H1 body or one section's own content) into blocks.
/// `lua shared` fences are skipped: they neither count as blocks nor split prose.
fn build_blocks<'i>(content: &[&'i Item<'i>], gap_line: u32) -> Vec<Draft<'i>> {
    let mut regions: Vec<(Vec<&'i Item<'i>>, u32)> = vec![(Vec::new(), gap_line)];
    let mut fences: Vec<&'i Fence> = Vec::new();
    for item in content {
        match item {
            Item::Fence(fence) if fence.shared => {}
            Item::Fence(fence) => {
                fences.push(fence);
                regions.push((Vec::new(), fence.end_line.saturating_add(1)));
            }
            other => {
                if let Some(region) = regions.last_mut() {
                    region.0.push(other);
                }
            }
        }
    }
    let fence_count = fences.len();
    let mut drafts: Vec<Draft<'i>> = Vec::new();
    for (index, (items, gap)) in regions.iter().enumerate() {
        let (prose, has_content) = region_prose(items, *gap);
        let between_fences = index > 0 && index < fence_count;
        if has_content || between_fences {
            drafts.push(Draft::Prose(prose));
        }
        if let Some(fence) = fences.get(index) {
            drafts.push(Draft::Lua(fence, Position::Plain));
        }
    }
    let first_is_lua = matches!(drafts.first(), Some(Draft::Lua(..)));
    let mut lua_seen = 0;
    for (index, draft) in drafts.iter_mut().enumerate() {
        if let Draft::Lua(_, position) = draft {
            lua_seen += 1;
            *position = if index == 0 && first_is_lua {
                Position::Prologue
            } else if lua_seen == fence_count {
                Position::Epilog
            } else {
                Position::Plain
            };
        }
    }
    drafts
}

fn structure(message: String, location: Option<(u32, u32)>) -> ParseError {
    body_error(ParseErrorKind::Structure, message, location)
}

fn body_error(kind: ParseErrorKind, message: String, location: Option<(u32, u32)>) -> ParseError {
    ParseError {
        kind,
        message,
        line: location.map(|l| l.0),
        column: location.map(|l| l.1),
    }
}

/// A section before nesting: its heading and the items of its own content.
struct FlatSection<'i> {
    name: String,
    level: u8,
    line: u32,
    parent: Option<usize>,
    content: Vec<&'i Item<'i>>,
}

pub(crate) struct BodyParts {
    pub title: String,
    pub title_line: u32,
    pub shared: Option<LuaBlock>,
    pub h1_blocks: Vec<Block>,
    pub sections: Vec<Section>,
}

/// A located fence-closing problem, kept until every structure check passed.
struct FenceProblem {
    line: u32,
    message: String,
    /// The opening fence line's length, for the caret.
    open_len: usize,
}

fn fence_problem(fence: &Fence, section: &str, position: Position) -> Option<FenceProblem> {
    let message = match (fence.close, fence.shared, position) {
        (FenceClose::Exact, ..) => return None,
        (FenceClose::NotExact, ..) => {
            format!("section `{section}` `lua` fence is not closed exactly")
        }
        (FenceClose::Unclosed, true, _) => "prompt `lua shared` fence is not closed".to_string(),
        (FenceClose::Unclosed, false, Position::Prologue) => {
            format!("section `{section}` prologue `lua` fence is not closed")
        }
        (FenceClose::Unclosed, false, Position::Epilog) => {
            format!("section `{section}` epilog `lua` fence is not closed")
        }
        (FenceClose::Unclosed, false, Position::Plain) => {
            format!("section `{section}` `lua` fence is not closed")
        }
    };
    Some(FenceProblem {
        line: fence.open_line,
        message,
        open_len: if fence.shared {
            SHARED_OPEN.len()
        } else {
            LUA_OPEN.len()
        },
    })
}

fn lua_block(fence: &Fence, role: BlockRole, label: String) -> LuaBlock {
    LuaBlock {
        source: fence.source.clone(),
        first_line: fence.open_line.saturating_add(1),
        role,
        label,
    }
}

/// Converts drafts to blocks, recording fence problems.
fn finish_blocks(
    drafts: Vec<Draft<'_>>,
    part_name: &str,
    h1_label: Option<&str>,
    problems: &mut Vec<FenceProblem>,
) -> Vec<Block> {
    drafts
        .into_iter()
        .map(|draft| match draft {
            Draft::Prose(prose) => Block::Prose(prose),
            Draft::Lua(fence, position) => {
                problems.extend(fence_problem(fence, part_name, position));
                let (role, label) = match (h1_label, position) {
                    (Some(label), _) => (BlockRole::H1, label.to_string()),
                    (None, Position::Prologue) => (
                        BlockRole::Prologue,
                        format!("section `{part_name}` prologue"),
                    ),
                    (None, Position::Epilog) => {
                        (BlockRole::Epilog, format!("section `{part_name}` epilog"))
                    }
                    (None, Position::Plain) => {
                        (BlockRole::Plain, format!("section `{part_name}` lua"))
                    }
                };
                Block::Lua(lua_block(fence, role, label))
            }
        })
        .collect()
}

/// The item text of a list marker line (trimmed), or `None` for any other line.
fn list_item(trimmed: &str) -> Option<&str> {
    for marker in ["- ", "* "] {
        if let Some(text) = trimmed.strip_prefix(marker) {
            return Some(text);
        }
    }
    if trimmed == "-" || trimmed == "*" {
        return Some("");
    }
    let digits = trimmed.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits > 0 {
        let after = &trimmed[digits..];
        for marker in [". ", ") "] {
            if let Some(text) = after.strip_prefix(marker) {
                return Some(text);
            }
        }
        if after == "." || after == ")" {
            return Some("");
        }
    }
    None
}

/// The items of a list section, `None` when the section is not a list. Every
/// empty item is recorded (and left out).
fn list_items(section: &FlatSection<'_>, sink: &mut Vec<Diagnostic>) -> Option<Vec<String>> {
    if section
        .content
        .iter()
        .any(|item| matches!(item, Item::Fence(_)))
    {
        return None;
    }
    let start = section
        .content
        .iter()
        .rposition(|item| matches!(item, Item::Break))
        .map(|i| i + 1)
        .unwrap_or(0);
    let mut lines = Vec::new();
    for item in &section.content[start..] {
        if let Item::Text { line, text } = item {
            if text.trim().is_empty() {
                continue;
            }
            match list_item(text.trim()) {
                Some(item_text) => lines.push((*line, text, item_text)),
                None => return None,
            }
        }
    }
    if lines.is_empty() {
        return None;
    }
    let mut items = Vec::with_capacity(lines.len());
    for (line, text, item_text) in lines {
        if item_text.is_empty() {
            let column = indentation(text).1 as u32 + 1;
            sink.push(
                Diagnostic::error(body_error(
                    ParseErrorKind::List,
                    format!("empty bullet item in list section `{}`", section.name),
                    Some((line, column)),
                ))
                .with_span(text.trim().len()),
            );
            continue;
        }
        items.push(item_text.to_string());
    }
    Some(items)
}

/// The body, with every problem recorded in `sink` in the order `parse`
/// meets them (H1, shared fence placement, heading tree, fence closing by
/// line, lists). The returned first lines are those of Lua blocks whose fence
/// is not closed exactly: their source runs into other text, so compiling it
/// would only repeat the fence problem.
pub(crate) fn parse_body(
    lines: &[BodyLine<'_>],
    sink: &mut Vec<Diagnostic>,
) -> (BodyParts, HashSet<u32>) {
    let items = scan(lines);

    let h1_indices: Vec<usize> = items
        .iter()
        .enumerate()
        .filter(|(_, item)| matches!(item, Item::Heading { level: 1, .. }))
        .map(|(i, _)| i)
        .collect();
    let heading_at = |index: usize| match items.get(index) {
        Some(Item::Heading {
            name, line, column, ..
        }) => Some((name.clone(), *line, *column)),
        _ => None,
    };
    let h1_index = h1_indices.first().copied();
    match h1_indices.as_slice() {
        [] => sink.push(Diagnostic::error(structure(
            "prompt requires an H1 title".into(),
            None,
        ))),
        [_] => {}
        [_, more @ ..] => {
            for (index, extra) in more.iter().enumerate() {
                let diagnostic = Diagnostic::error(structure(
                    "prompt must contain exactly one H1 title".into(),
                    None,
                ));
                // `parse` reports this once; each extra H1 is a place to look.
                match (index, heading_at(*extra)) {
                    (0, Some((_, line, column))) => {
                        sink.push(diagnostic.located_beyond_parse(line, column).with_span(1))
                    }
                    (_, Some((_, line, column))) => sink.push(
                        diagnostic
                            .located_beyond_parse(line, column)
                            .with_span(1)
                            .with_note("another H1 title"),
                    ),
                    _ => sink.push(diagnostic),
                }
            }
        }
    }
    let (title, title_line) = match h1_index.and_then(heading_at) {
        Some((name, line, column)) => {
            if name.is_empty() {
                sink.push(
                    Diagnostic::error(structure("prompt H1 title must not be empty".into(), None))
                        .located_beyond_parse(line, column)
                        .with_span(1),
                );
            }
            (name, line)
        }
        None => (String::new(), 0),
    };

    // Without an H1 the sections start at the first heading.
    let first_section = items
        .iter()
        .enumerate()
        .skip(h1_index.map_or(0, |i| i + 1))
        .find(|(_, item)| matches!(item, Item::Heading { .. }))
        .map(|(i, _)| i)
        .unwrap_or(items.len());

    let shared_fences: Vec<(usize, &Fence)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| match item {
            Item::Fence(fence) if fence.shared => Some((i, fence)),
            _ => None,
        })
        .collect();
    for (_, extra) in shared_fences.iter().skip(1) {
        sink.push(
            Diagnostic::error(body_error(
                ParseErrorKind::Fence,
                "prompt allows at most one `lua shared` fence".into(),
                Some((extra.open_line, 1)),
            ))
            .with_span(SHARED_OPEN.len()),
        );
    }
    if let Some((index, fence)) = shared_fences.first() {
        if h1_index.is_some_and(|h1| *index < h1) || *index > first_section {
            sink.push(
                Diagnostic::error(body_error(
                    ParseErrorKind::Fence,
                    "`lua shared` fence is allowed only in H1".into(),
                    Some((fence.open_line, 1)),
                ))
                .with_span(SHARED_OPEN.len()),
            );
        }
    }

    // The section tree, checked heading by heading in file order. A bad
    // heading still opens its section, so its children are judged normally.
    let mut flat: Vec<FlatSection<'_>> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut first_seen: HashMap<(Option<usize>, String), u32> = HashMap::new();
    for item in items.iter().skip(first_section) {
        let Item::Heading {
            level,
            name,
            line,
            column,
        } = item
        else {
            if let Some(current) = flat.last_mut() {
                current.content.push(item);
            }
            continue;
        };
        let (level, line, location) = (*level, *line, Some((*line, *column)));
        if level == 1 {
            // Another H1: already reported above.
            continue;
        }
        let heading_span = name.len().max(1);
        if name.is_empty() {
            sink.push(
                Diagnostic::error(structure(
                    format!("an H{level} section heading must not be empty"),
                    location,
                ))
                .with_span(usize::from(level)),
            );
        }
        while open
            .last()
            .is_some_and(|&i| flat.get(i).is_some_and(|s| s.level >= level))
        {
            open.pop();
        }
        let parent = open.last().copied();
        let parent_level = parent
            .and_then(|i| flat.get(i))
            .map(|s| s.level)
            .unwrap_or(1);
        if !name.is_empty() && parent_level + 1 != level {
            sink.push(
                Diagnostic::error(structure(
                    format!(
                        "section `{name}` is an orphan H{level} heading with no parent H{}",
                        level - 1
                    ),
                    location,
                ))
                .with_span(usize::from(level)),
            );
        }
        if !name.is_empty() {
            if let Some(first) = first_seen.get(&(parent, name.clone())) {
                sink.push(
                    Diagnostic::error(structure(
                        format!(
                            "duplicate sibling section name `{name}`: first declared at line {first}, again at line {line}; sibling section names must be unique"
                        ),
                        location,
                    ))
                    .with_span(heading_span),
                );
            } else {
                first_seen.insert((parent, name.clone()), line);
            }
        }
        open.push(flat.len());
        flat.push(FlatSection {
            name: name.clone(),
            level,
            line,
            parent,
            content: Vec::new(),
        });
    }

    // Blocks: the H1 body first, then each section in file order.
    let mut problems: Vec<FenceProblem> = Vec::new();
    let h1_content: Vec<&Item<'_>> = match h1_index {
        Some(h1) => items
            .get(h1 + 1..first_section)
            .unwrap_or_default()
            .iter()
            .collect(),
        None => Vec::new(),
    };
    let h1_label = format!("H1 `{title}` lua");
    let shared = match shared_fences.first() {
        Some((_, fence)) => {
            problems.extend(fence_problem(fence, &title, Position::Plain));
            Some(lua_block(
                fence,
                BlockRole::Shared,
                "prompt shared library".to_string(),
            ))
        }
        None => None,
    };
    let h1_drafts = build_blocks(&h1_content, title_line.saturating_add(1));
    let h1_blocks = finish_blocks(h1_drafts, &title, Some(&h1_label), &mut problems);

    let mut section_blocks: Vec<Vec<Block>> = Vec::with_capacity(flat.len());
    for section in &flat {
        let drafts = build_blocks(&section.content, section.line.saturating_add(1));
        section_blocks.push(finish_blocks(drafts, &section.name, None, &mut problems));
    }
    // `parse` reports the first by line; the sort is stable for ties.
    problems.sort_by_key(|p| p.line);
    let mut unclosed: HashSet<u32> = HashSet::new();
    for problem in &problems {
        unclosed.insert(problem.line.saturating_add(1));
        sink.push(
            Diagnostic::error(body_error(
                ParseErrorKind::Fence,
                problem.message.clone(),
                Some((problem.line, 1)),
            ))
            .with_span(problem.open_len),
        );
    }

    let mut section_lists: Vec<Option<Vec<String>>> = Vec::with_capacity(flat.len());
    for section in &flat {
        section_lists.push(list_items(section, sink));
    }

    // Nest the flat sections: children are attached to their parents from the
    // last section backwards, so every child is complete before it moves.
    let mut built: Vec<Option<Section>> = flat
        .iter()
        .zip(section_blocks)
        .zip(section_lists)
        .map(|((flat, blocks), list)| {
            Some(Section {
                name: flat.name.clone(),
                level: flat.level,
                line: flat.line,
                blocks: if list.is_some() { Vec::new() } else { blocks },
                list_items: list,
                children: Vec::new(),
            })
        })
        .collect();
    for index in (0..flat.len()).rev() {
        if let Some(parent) = flat.get(index).and_then(|s| s.parent) {
            if let Some(child) = built.get_mut(index).and_then(Option::take) {
                if let Some(Some(parent_section)) = built.get_mut(parent) {
                    parent_section.children.push(child);
                }
            }
        }
    }
    let mut sections: Vec<Section> = built.into_iter().flatten().collect();
    // Children were attached last-first; restore file order at every level.
    fn restore_order(sections: &mut [Section]) {
        for section in sections {
            section.children.reverse();
            restore_order(&mut section.children);
        }
    }
    restore_order(&mut sections);

    (
        BodyParts {
            title,
            title_line,
            shared,
            h1_blocks,
            sections,
        },
        unclosed,
    )
}
