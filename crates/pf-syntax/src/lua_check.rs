//! Compiles every Lua block at parse time (never runs it), so a syntax error is
//! a parse error located in the prompt file.

use crate::ast::*;
use crate::diagnostics::Diagnostic;
use mlua::{ChunkMode, Lua, LuaOptions, StdLib};
use std::collections::HashSet;

/// Every Lua block of the prompt, in file order.
pub(crate) fn all_blocks<'p>(
    shared: Option<&'p LuaBlock>,
    h1_blocks: &'p [Block],
    sections: &'p [Section],
) -> Vec<&'p LuaBlock> {
    fn walk<'p>(sections: &'p [Section], out: &mut Vec<&'p LuaBlock>) {
        for section in sections {
            for block in &section.blocks {
                if let Block::Lua(lua) = block {
                    out.push(lua);
                }
            }
            walk(&section.children, out);
        }
    }
    let mut blocks: Vec<&LuaBlock> = shared.into_iter().collect();
    for block in h1_blocks {
        if let Block::Lua(lua) = block {
            blocks.push(lua);
        }
    }
    walk(sections, &mut blocks);
    blocks.sort_by_key(|block| block.first_line);
    blocks
}

fn lua_error(message: String) -> ParseError {
    ParseError {
        kind: ParseErrorKind::Lua,
        message,
        line: None,
        column: None,
    }
}

/// The block-relative line `N` of a compiler diagnostic
/// `[string "{chunk name}"]:N: ...`. Lua shortens long chunk names, so the
/// exact prefix is tried first, then the first `"]:N:` after `[string "`.
fn diagnostic_line(diagnostic: &str, chunk_name: &str) -> Option<u32> {
    let exact = format!("[string \"{chunk_name}\"]:");
    let rest = match diagnostic.strip_prefix(&exact) {
        Some(rest) => rest,
        None => {
            let after = diagnostic.strip_prefix("[string \"")?;
            let end = after.find("\"]:")?;
            after.get(end + 3..)?
        }
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if rest.as_bytes().get(digits) != Some(&b':') {
        return None;
    }
    rest.get(..digits)?.parse().ok()
}

/// Where on `line` the compiler's `near 'TOKEN'` is, else the first
/// non-blank byte: (1-based column, span length).
fn column_on_line(line: &str, diagnostic: &str) -> (u32, usize) {
    let token = diagnostic
        .rsplit_once(" near '")
        .and_then(|(_, rest)| rest.strip_suffix('\''))
        .filter(|token| !token.is_empty());
    if let Some(at) = token.and_then(|token| line.rfind(token)) {
        let len = token.map_or(1, str::len);
        return (u32::try_from(at + 1).unwrap_or(u32::MAX), len);
    }
    let start = line.len() - line.trim_start().len();
    (
        u32::try_from(start + 1).unwrap_or(u32::MAX),
        line.trim().len(),
    )
}

/// Compiles each block as text (binary chunks refused), skipping the blocks
/// whose first line is in `skip`, and records every failure as
/// `lua compilation error at {label} (line {first_line}): {diagnostic}`
/// (guide ch. 05), located at the absolute prompt-file line of the fault.
pub(crate) fn compile_all(blocks: &[&LuaBlock], skip: &HashSet<u32>, sink: &mut Vec<Diagnostic>) {
    if blocks.is_empty() {
        return;
    }
    let lua = match Lua::new_with(StdLib::NONE, LuaOptions::default()) {
        Ok(lua) => lua,
        Err(e) => {
            sink.push(Diagnostic::error(lua_error(format!(
                "lua compilation error: cannot start the Lua compiler: {e}"
            ))));
            return;
        }
    };
    for block in blocks {
        if skip.contains(&block.first_line) {
            continue;
        }
        // A chunk name cannot hold NUL; Lua shows the same text without it.
        let chunk_name = block.label.replace('\0', "");
        let compiled = lua
            .load(block.source.as_bytes())
            .set_name(chunk_name.as_str())
            .set_mode(ChunkMode::Text)
            .into_function();
        if let Err(error) = compiled {
            let diagnostic = match error {
                mlua::Error::SyntaxError { message, .. } => message,
                other => other.to_string(),
            };
            let error = lua_error(format!(
                "lua compilation error at {} (line {}): {}",
                block.label, block.first_line, diagnostic
            ));
            let block_lines = block.source.split('\n').count().max(1);
            let block_line = diagnostic_line(&diagnostic, &chunk_name)
                .unwrap_or(1)
                .clamp(1, u32::try_from(block_lines).unwrap_or(u32::MAX));
            let line_text = block
                .source
                .split('\n')
                .nth(block_line as usize - 1)
                .unwrap_or_default();
            let (column, span) = column_on_line(line_text, &diagnostic);
            let line = block.first_line.saturating_add(block_line - 1);
            sink.push(
                Diagnostic::error(error)
                    .located_beyond_parse(line, column)
                    .with_span(span)
                    .with_note(format!(
                        "line {block_line} of the block is line {line} of the prompt file"
                    )),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_line_from_compiler_diagnostics() {
        let name = "section `A` prologue";
        assert_eq!(
            diagnostic_line("[string \"section `A` prologue\"]:3: x near 'y'", name),
            Some(3)
        );
        assert_eq!(
            diagnostic_line("[string \"section `A very long...\"]:12: x", "long"),
            Some(12)
        );
        assert_eq!(
            diagnostic_line("attempt to load a binary chunk", name),
            None
        );
        assert_eq!(diagnostic_line("[string \"x\"]:: y", "x"), None);
        assert_eq!(diagnostic_line("[string \"x", "y"), None);
    }

    #[test]
    fn column_of_the_near_token() {
        assert_eq!(
            column_on_line("x = = 1", "unexpected symbol near '='"),
            (5, 1)
        );
        assert_eq!(column_on_line("  foo(", "near <eof>"), (3, 4));
        assert_eq!(column_on_line("", "near <eof>"), (1, 0));
    }
}
