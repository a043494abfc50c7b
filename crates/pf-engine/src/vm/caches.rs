//! The per-thread bytecode caches: the engine's own chunks and prompt blocks,
//! compiled once per thread and loaded from their dump after (the plain path,
//! settings.rs `BytecodeCaches`, compiles every time).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use mlua::{Function, Lua};

thread_local! {
    /// Bytecode of the engine's own Lua chunks, compiled once per thread: every
    /// section VM runs them, and lexing them again for each VM was most of a VM's cost.
    static INTERNAL_BYTECODE: std::cell::RefCell<std::collections::HashMap<&'static str, Rc<[u8]>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Load one of the engine's own chunks (never prompt code: prompt chunks stay text-only).
pub(crate) fn internal_chunk(
    lua: &Lua,
    name: &'static str,
    source: &'static str,
) -> mlua::Result<mlua::Function> {
    internal_chunk_keyed(lua, name, name, || source.into())
}

/// [`internal_chunk`] for a chunk cached under `key`, which need not be its
/// name (a deferred part of an engine chunk has that chunk's name), and whose
/// source is made only when this thread has not compiled it yet.
pub(crate) fn internal_chunk_keyed(
    lua: &Lua,
    key: &'static str,
    name: &'static str,
    source: impl FnOnce() -> std::borrow::Cow<'static, str>,
) -> mlua::Result<mlua::Function> {
    if !crate::settings::fast(crate::settings::FastPath::BytecodeCaches) {
        return lua
            .load(&*source())
            .set_name(name)
            .set_mode(mlua::ChunkMode::Text)
            .into_function();
    }
    // Shared, not copied: loading never re-enters this cache.
    let cached = INTERNAL_BYTECODE.with(|c| c.borrow().get(key).cloned());
    if let Some(code) = cached {
        return lua
            .load(&*code)
            .set_name(name)
            .set_mode(mlua::ChunkMode::Binary)
            .into_function();
    }
    let source = source();
    let f = lua
        .load(&*source)
        .set_name(name)
        .set_mode(mlua::ChunkMode::Text)
        .into_function()?;
    let code = f.dump(false);
    INTERNAL_BYTECODE.with(|c| c.borrow_mut().insert(key, Rc::from(code)));
    Ok(f)
}

/// A prompt block's chunk name and source.
type BlockKey = (String, String);

/// How many prompt blocks' bytecode one thread keeps (a long-lived Host runs many prompts).
const BLOCK_CACHE_LIMIT: usize = 512;

thread_local! {
    /// Bytecode of prompt blocks this thread compiled, by chunk name and source:
    /// a fanout enters the same block once per arm, and compiling it again each
    /// time was a tenth of a section entry. Only the engine's own dump of text
    /// it compiled is ever loaded as binary; the function is new in every VM.
    static BLOCK_BYTECODE: RefCell<HashMap<BlockKey, Rc<[u8]>>> =
        RefCell::new(HashMap::new());
}

/// Compile one prompt block (text only), from this thread's cache when it was
/// compiled before.
pub(crate) fn block_chunk(lua: &Lua, name: &str, source: String) -> mlua::Result<Function> {
    if !crate::settings::fast(crate::settings::FastPath::BytecodeCaches) {
        return lua
            .load(source)
            .set_name(name)
            .set_mode(mlua::ChunkMode::Text)
            .into_function();
    }
    let key = (name.to_string(), source);
    let cached = BLOCK_BYTECODE.with(|c| c.borrow().get(&key).cloned());
    if let Some(code) = cached {
        return lua
            .load(&*code)
            .set_name(name)
            .set_mode(mlua::ChunkMode::Binary)
            .into_function();
    }
    let f = lua
        .load(key.1.as_str())
        .set_name(name)
        .set_mode(mlua::ChunkMode::Text)
        .into_function()?;
    let code = f.dump(false);
    BLOCK_BYTECODE.with(|c| {
        let mut cache = c.borrow_mut();
        if cache.len() >= BLOCK_CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(key, Rc::from(code));
    });
    Ok(f)
}
