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
            .set_name(chunk_name)
            .set_mode(ChunkMode::Text)
            .into_function();
        if let Err(error) = compiled {
            let diagnostic = match error {
                mlua::Error::SyntaxError { message, .. } => message,
                other => other.to_string(),
            };
            return Err(lua_error(format!(
                "lua compilation error at {} (line {}): {}",
                block.label, block.first_line, diagnostic
            )));
        }
    }
    Ok(())
}
