//! Compiles every Lua block at parse time (never runs it), so a syntax error is
//! a parse error located in the prompt file.

use crate::ast::*;
use mlua::{ChunkMode, Lua, LuaOptions, StdLib};

/// Every Lua block of the prompt, in file order.
pub(crate) fn all_blocks(prompt: &Prompt) -> Vec<&LuaBlock> {
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
    let mut blocks: Vec<&LuaBlock> = prompt.shared.iter().collect();
    for block in &prompt.h1_blocks {
        if let Block::Lua(lua) = block {
            blocks.push(lua);
        }
    }
    walk(&prompt.sections, &mut blocks);
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

/// Compiles each block as text (binary chunks refused); the first failure is
/// `lua compilation error at {label} (line {first_line}): {diagnostic}`.
pub(crate) fn compile_all(prompt: &Prompt) -> Result<(), ParseError> {
    let blocks = all_blocks(prompt);
    if blocks.is_empty() {
        return Ok(());
    }
    let lua = Lua::new_with(StdLib::NONE, LuaOptions::default()).map_err(|e| {
        lua_error(format!(
            "lua compilation error: cannot start the Lua compiler: {e}"
        ))
    })?;
    for block in blocks {
        // A chunk name cannot hold NUL; Lua shows the same text without it.
        let chunk_name = block.label.replace('\0', "");
        let compiled = lua
            .load(block.source.as_bytes())
            .set_name(chunk_name.clone())
            .set_mode(ChunkMode::Text)
            .into_function();
        if let Err(error) = compiled {
            let diagnostic = match error {
                mlua::Error::SyntaxError { message, .. } => message,
                other => other.to_string(),
            };
            let diagnostic = absolute_lines(&diagnostic, &chunk_name, block.first_line);
            return Err(lua_error(format!(
                "lua compilation error at {} (line {}): {}",
                block.label, block.first_line, diagnostic
            )));
        }
    }
    Ok(())
}

/// Rewrite the compiler's block-relative `[string "label"]:N:` positions to prompt-file
/// lines, the numbering runtime errors use too.
fn absolute_lines(diagnostic: &str, label: &str, first_line: u32) -> String {
    let marker = format!("[string \"{label}\"]:");
    let mut out = String::with_capacity(diagnostic.len());
    let mut rest = diagnostic;
    while let Some(at) = rest.find(&marker) {
        let after = &rest[at + marker.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..at + marker.len()]);
        match after[..digits].parse::<u64>() {
            Ok(n) if digits > 0 && after[digits..].starts_with(':') => {
                out.push_str(&(n + u64::from(first_line) - 1).to_string());
            }
            _ => out.push_str(&after[..digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::absolute_lines;

    #[test]
    fn diagnostics_name_prompt_file_lines() {
        let d = "[string \"section `A` prologue\"]:2: unexpected symbol near <eof>";
        assert_eq!(
            absolute_lines(d, "section `A` prologue", 12),
            "[string \"section `A` prologue\"]:13: unexpected symbol near <eof>"
        );
        assert_eq!(absolute_lines("no marker here", "x", 5), "no marker here");
    }
}
