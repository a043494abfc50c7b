//! `--update`: write a case's current results back as its expectations,
//! touching only that case's `expect:` block so the rest of the file (other
//! keys, comments, order, blank lines) stays as the author wrote it.
//!
//! Positions come from saphyr-parser's events (the parser the workspace
//! already uses for frontmatter); a block's extent is found by indentation,
//! and the new block is emitted by serde_norway in its block style.

use saphyr_parser::{Event, Parser};
use serde_json::Value as Json;

/// Where one case sits in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseSpan {
    /// The line of the case's first key (1-based).
    pub line: usize,
    /// The column of the case's keys (0-based).
    pub key_col: usize,
    /// Whether the case is a block mapping (a flow `{...}` case is not rewritten).
    pub block: bool,
    /// The `expect` key's line (1-based) and column (0-based), when present.
    pub expect: Option<(usize, usize)>,
}

/// A node of the file with the position of its first character.
enum Tree {
    Scalar(String, usize, usize),
    Seq(Vec<Tree>),
    Map(Vec<(Tree, Tree)>, bool),
}

impl Tree {
    fn pos(&self) -> Option<(usize, usize)> {
        match self {
            Tree::Scalar(_, l, c) => Some((*l, *c)),
            Tree::Seq(items) => items.first().and_then(Tree::pos),
            Tree::Map(pairs, _) => pairs.first().and_then(|(k, _)| k.pos()),
        }
    }
}

/// Build the document's tree (first document only; aliases become empty scalars).
fn tree(text: &str) -> Result<Option<Tree>, String> {
    let mut events = Vec::new();
    for item in Parser::new_from_str(text) {
        let (event, span) = item.map_err(|e| e.to_string())?;
        events.push((event, span.start));
    }
    let mut at = 0;
    while at < events.len() {
        if matches!(
            events[at].0,
            Event::Scalar(..) | Event::SequenceStart(..) | Event::MappingStart(..)
        ) {
            return Ok(Some(node(text, &events, &mut at)));
        }
        at += 1;
    }
    Ok(None)
}

fn node(text: &str, events: &[(Event<'_>, saphyr_parser::Marker)], at: &mut usize) -> Tree {
    let (event, mark) = &events[*at];
    *at += 1;
    match event {
        Event::Scalar(value, ..) => Tree::Scalar(value.to_string(), mark.line(), mark.col()),
        Event::SequenceStart(..) => {
            let mut items = Vec::new();
            while *at < events.len() && !matches!(events[*at].0, Event::SequenceEnd) {
                items.push(node(text, events, at));
            }
            *at += 1;
            Tree::Seq(items)
        }
        Event::MappingStart(..) => {
            let flow = text
                .get(mark.index()..)
                .is_some_and(|rest| rest.starts_with('{'));
            let mut pairs = Vec::new();
            while *at < events.len() && !matches!(events[*at].0, Event::MappingEnd) {
                let key = node(text, events, at);
                if *at >= events.len() {
                    break;
                }
                let value = node(text, events, at);
                pairs.push((key, value));
            }
            *at += 1;
            Tree::Map(pairs, flow)
        }
        _ => Tree::Scalar(String::new(), mark.line(), mark.col()),
    }
}

fn get<'t>(pairs: &'t [(Tree, Tree)], key: &str) -> Option<&'t (Tree, Tree)> {
    pairs
        .iter()
        .find(|(k, _)| matches!(k, Tree::Scalar(s, ..) if s == key))
}

/// Every case of the file's `cases:` list, in order.
pub fn locate_cases(text: &str) -> Result<Vec<CaseSpan>, String> {
    let Some(Tree::Map(top, _)) = tree(text)? else {
        return Ok(Vec::new());
    };
    let Some((_, Tree::Seq(cases))) = get(&top, "cases") else {
        return Ok(Vec::new());
    };
    Ok(cases
        .iter()
        .map(|case| {
            let (line, key_col) = case.pos().unwrap_or((1, 0));
            match case {
                Tree::Map(pairs, flow) => CaseSpan {
                    line,
                    key_col,
                    block: !flow,
                    expect: get(pairs, "expect").and_then(|(k, _)| k.pos()),
                },
                _ => CaseSpan {
                    line,
                    key_col,
                    block: false,
                    expect: None,
                },
            }
        })
        .collect())
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_filler(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

/// The last line index (0-based) of the block that starts at `start` and
/// holds every following line indented more than `col` (or at least `min`).
fn block_end(lines: &[&str], start: usize, min_indent: usize) -> usize {
    let mut end = start;
    for (i, line) in lines.iter().enumerate().skip(start + 1) {
        if is_filler(line) {
            continue;
        }
        if indent_of(line) >= min_indent {
            end = i;
        } else {
            break;
        }
    }
    end
}

/// `expect:` and its mapping as block YAML, indented by `indent`.
fn emit(indent: usize, expect: &Json) -> Result<Vec<String>, String> {
    let pad = " ".repeat(indent);
    if expect.as_object().is_none_or(|m| m.is_empty()) {
        return Ok(vec![format!("{pad}expect: {{}}")]);
    }
    let body = serde_norway::to_string(expect).map_err(|e| e.to_string())?;
    let mut out = vec![format!("{pad}expect:")];
    for line in body.lines() {
        if line.is_empty() {
            out.push(String::new());
        } else {
            out.push(format!("{pad}  {line}"));
        }
    }
    Ok(out)
}

/// `text` with each listed case's `expect:` block replaced by (or, where it
/// had none, given) the new one. Flow-style cases are refused by name.
pub fn rewrite(text: &str, updates: &[(usize, Json)]) -> Result<String, String> {
    let spans = locate_cases(text)?;
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut ordered: Vec<&(usize, Json)> = updates.iter().collect();
    // From the bottom up, so earlier line numbers stay valid.
    ordered.sort_by_key(|(i, _)| std::cmp::Reverse(spans.get(*i).map_or(0, |s| s.line)));
    for (index, expect) in ordered {
        let span = spans
            .get(*index)
            .ok_or_else(|| format!("case #{} not found in the file", index + 1))?;
        if !span.block {
            return Err(format!(
                "case #{} (line {}) is written in flow style; --update rewrites block-style cases only",
                index + 1,
                span.line
            ));
        }
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let (start, end, indent) = match span.expect {
            Some((line, col))
                if refs
                    .get(line.saturating_sub(1))
                    .and_then(|l| l.get(..col))
                    .is_some_and(|before| !before.trim().is_empty()) =>
            {
                return Err(format!(
                    "case #{} (line {line}): `expect:` shares its line with other text; \
                     put it on a line of its own for --update",
                    index + 1
                ));
            }
            Some((line, col)) => {
                let start = line.saturating_sub(1);
                (start, block_end(&refs, start, col + 1), col)
            }
            None => {
                let start = span.line.saturating_sub(1);
                let end = block_end(&refs, start, span.key_col);
                (end + 1, end, span.key_col)
            }
        };
        let block = emit(indent, expect)?;
        if start > end {
            // Insert after `end` (the case had no `expect`).
            let at = (end + 1).min(lines.len());
            lines.splice(at..at, block);
        } else {
            lines.splice(start..=end.min(lines.len().saturating_sub(1)), block);
        }
    }
    let mut out = lines.join("\n");
    if text.ends_with('\n') || text.is_empty() {
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FILE: &str = "# tests\nprompt: p.md\ncases:\n  - name: one   # first\n    args: x\n    expect:\n      result: old\n      # trailing comment\n\n  - name: two\n    args: y\n\n# end\n";

    #[test]
    fn cases_are_located() {
        let spans = locate_cases(FILE).expect("parses");
        assert_eq!(
            spans,
            vec![
                CaseSpan {
                    line: 4,
                    key_col: 4,
                    block: true,
                    expect: Some((6, 4))
                },
                CaseSpan {
                    line: 10,
                    key_col: 4,
                    block: true,
                    expect: None
                },
            ]
        );
    }

    #[test]
    fn only_the_expect_blocks_change() {
        let out = rewrite(
            FILE,
            &[
                (0, json!({"result": "new\ntext"})),
                (1, json!({"outcome": "failed", "error": {"kind": "Lua"}})),
            ],
        )
        .expect("rewrites");
        assert_eq!(
            out,
            "# tests\nprompt: p.md\ncases:\n  - name: one   # first\n    args: x\n    expect:\n      result: |-\n        new\n        text\n      # trailing comment\n\n  - name: two\n    args: y\n    expect:\n      outcome: failed\n      error:\n        kind: Lua\n\n# end\n"
        );
        let spans = locate_cases(&out).expect("still parses");
        assert_eq!(spans.len(), 2);
    }

    #[test]
    fn an_expect_sharing_the_dash_line_is_refused() {
        let text = "cases:\n  - expect: {result: a}\n    name: one\n";
        let err = rewrite(text, &[(0, json!({"result": "b"}))]).err();
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("shares its line")),
            "{err:?}"
        );
    }
}
