//! One Lua-visible dispatcher per section VM for the suspending host functions.
//!
//! `Lua::create_async_function` builds, for every function, an environment
//! table, two C functions and a Lua poller chunk; a section VM registers some
//! twenty suspending functions, and doing that in every VM was a fifth of a
//! section entry. Instead each VM makes one async dispatcher, and each host
//! function is a Lua closure `function(...) return check(dispatch(id, ...)) end`
//! (the prelude's `wrap_async`) over its entry in this table. Nothing a prompt
//! can reach tells the two apart: the closure is what `H.wrap` returned before,
//! and the dispatcher is only its upvalue.

use std::cell::RefCell;
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use mlua::{Function, Lua, MultiValue, Value};

/// A suspending host function, type-erased: what `host_async` built.
pub(crate) type AsyncEntry =
    Rc<dyn Fn(Lua, MultiValue) -> LocalBoxFuture<'static, mlua::Result<MultiValue>>>;

/// The VM's dispatcher, the prelude's closure maker, and every entry so far.
struct AsyncTable {
    dispatch: Function,
    wrap_async: Function,
    entries: RefCell<Vec<AsyncEntry>>,
}

/// Register `entry` in this VM; the Lua function prompts call.
pub(crate) fn register_async(lua: &Lua, entry: AsyncEntry) -> mlua::Result<Function> {
    if lua.app_data_ref::<AsyncTable>().is_none() {
        let table = AsyncTable {
            dispatch: make_dispatcher(lua)?,
            wrap_async: crate::ctx::helpers(lua)?.get("wrap_async")?,
            entries: RefCell::new(Vec::new()),
        };
        lua.set_app_data(table);
    }
    let (dispatch, wrap_async, id) = {
        let Some(table) = lua.app_data_ref::<AsyncTable>() else {
            return Err(mlua::Error::runtime(
                "internal invariant violated: host function table missing",
            ));
        };
        let mut entries = table.entries.borrow_mut();
        entries.push(entry);
        (
            table.dispatch.clone(),
            table.wrap_async.clone(),
            entries.len() - 1,
        )
    };
    wrap_async.call((dispatch, id))
}

fn make_dispatcher(lua: &Lua) -> mlua::Result<Function> {
    lua.create_async_function(|lua, args: MultiValue| {
        let mut args = args;
        let entry = match args.pop_front() {
            Some(Value::Integer(id)) => usize::try_from(id).ok().and_then(|id| {
                lua.app_data_ref::<AsyncTable>()
                    .and_then(|table| table.entries.borrow().get(id).cloned())
            }),
            _ => None,
        };
        let future = entry.map(|entry| entry(lua.clone(), args));
        async move {
            match future {
                Some(future) => future.await,
                None => Err(mlua::Error::runtime(
                    "internal invariant violated: unknown host function",
                )),
            }
        }
    })
}
