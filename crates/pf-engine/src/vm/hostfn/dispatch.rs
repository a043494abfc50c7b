//! Two Lua-visible dispatchers per section VM for the host functions.
//!
//! `Lua::create_async_function` builds, for every function, an environment
//! table, two C functions and a Lua poller chunk, and `create_function` a
//! userdata and a C closure; a section VM registers some sixty host
//! functions, and doing that in every VM was a third of a section entry.
//! Instead each VM makes one sync and one async dispatcher, and each host
//! function is a Lua closure `function(...) return check(dispatch(id, ...)) end`
//! (the prelude's `wrap_host`, and `wrap_async`, which finds its dispatcher
//! at call time) over its entry in this table. Nothing a prompt
//! can reach tells them apart from before: the closure has the shape `H.wrap`
//! gave, and the dispatcher is only its upvalue.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use mlua::{Function, Lua, MultiValue, Value};

/// A suspending host function, type-erased: what `host_async` built.
pub(crate) type AsyncEntry =
    Rc<dyn Fn(Lua, MultiValue) -> LocalBoxFuture<'static, mlua::Result<MultiValue>>>;

/// A plain host function, type-erased: what `host_fn` built.
pub(crate) type SyncEntry = Rc<dyn Fn(&Lua, MultiValue) -> mlua::Result<MultiValue>>;

/// The VM's dispatchers, the prelude's closure makers and every entry so far.
struct HostFns {
    dispatch_sync: Function,
    wrap_host: Function,
    wrap_async: Function,
    async_entries: RefCell<Vec<AsyncEntry>>,
    /// Each with whether it is a metamethod of an engine proxy (`register_sync`).
    sync_entries: RefCell<Vec<(SyncEntry, bool)>>,
    /// Builds the globals still pending (vm/mod.rs `lazy_globals`) while some may be.
    fill_pending: Cell<Option<FillGlobals>>,
}

/// What builds a VM's pending globals (vm/mod.rs).
pub(crate) type FillGlobals = fn(&Lua) -> mlua::Result<()>;

fn ensure_table(lua: &Lua) -> mlua::Result<()> {
    if lua.app_data_ref::<HostFns>().is_none() {
        let helpers = helper_table(lua)?;
        // The async dispatcher costs mlua a coroutine library and a compiled
        // poller chunk, so it is made on the first suspending call (most
        // section entries make none): the closures find it in `H`.
        helpers.raw_set(
            "make_async_dispatch",
            // Nil when there is no memory left to make it: the prelude raises
            // Lua's own memory error then, which the sandbox `pcall` turns into
            // the `lua` error value (an mlua error would reach Lua as userdata).
            lua.create_function(|lua, ()| {
                let made = helper_table(lua).and_then(|helpers| {
                    let dispatch = dispatcher_beside_prompt_globals(lua)?;
                    helpers.raw_set("dispatch_async", dispatch.clone())?;
                    Ok(dispatch)
                });
                match made {
                    Ok(dispatch) => Ok(Some(dispatch)),
                    Err(mlua::Error::MemoryError(_)) => Ok(None),
                    Err(other) => Err(other),
                }
            })?,
        )?;
        let dispatch_sync = make_sync_dispatcher(lua)?;
        let table = HostFns {
            dispatch_sync,
            wrap_host: helpers.get("wrap_host")?,
            wrap_async: helpers.get("wrap_async")?,
            async_entries: RefCell::new(Vec::new()),
            sync_entries: RefCell::new(Vec::new()),
            fill_pending: Cell::new(None),
        };
        lua.set_app_data(table);
    }
    Ok(())
}

/// While `fill` is set, a host call given a table or a function runs it first:
/// whatever the host reads, walks or calls back is reached from its arguments.
pub(crate) fn set_fill_pending(lua: &Lua, fill: Option<FillGlobals>) {
    if let Some(table) = lua.app_data_ref::<HostFns>() {
        table.fill_pending.set(fill);
    }
}

/// The filler, while globals may still be pending.
pub(crate) fn fill_pending(lua: &Lua) -> Option<FillGlobals> {
    lua.app_data_ref::<HostFns>()
        .and_then(|table| table.fill_pending.get())
}

/// Build the pending globals first when `value` is a table Rust is about to
/// walk (through the filler vm/mod.rs set, so the modules below the VM need not
/// import it).
pub(crate) fn fill_if_table(lua: &Lua, value: &Value) -> mlua::Result<()> {
    match (value, fill_pending(lua)) {
        (Value::Table(_), Some(fill)) => fill(lua),
        _ => Ok(()),
    }
}

/// Build the pending globals first when the host is handed a table or a
/// function, past the first `skip` arguments.
fn fill_before(lua: &Lua, args: &MultiValue, skip: usize) -> mlua::Result<()> {
    if let Some(fill) = fill_pending(lua) {
        if args
            .iter()
            .skip(skip)
            .any(|v| matches!(v, Value::Table(_) | Value::Function(_)))
        {
            fill(lua)?;
        }
    }
    Ok(())
}

fn missing() -> mlua::Error {
    mlua::Error::runtime("internal invariant violated: host function table missing")
}

/// Register a suspending host function in this VM; the Lua function prompts call.
pub(crate) fn register_async(lua: &Lua, entry: AsyncEntry) -> mlua::Result<Function> {
    ensure_table(lua)?;
    let (wrap_async, id) = {
        let table = lua.app_data_ref::<HostFns>().ok_or_else(missing)?;
        let mut entries = table.async_entries.borrow_mut();
        entries.push(entry);
        (table.wrap_async.clone(), entries.len() - 1)
    };
    wrap_async.call(id)
}

/// Register a plain host function in this VM; the Lua function prompts call.
/// `on_proxy`: a metamethod of one of the engine's proxy tables (`sys`, `var`),
/// whose first argument is that proxy, which the host never walks.
pub(crate) fn register_sync(lua: &Lua, entry: SyncEntry, on_proxy: bool) -> mlua::Result<Function> {
    ensure_table(lua)?;
    let (dispatch, wrap_host, id) = {
        let table = lua.app_data_ref::<HostFns>().ok_or_else(missing)?;
        let mut entries = table.sync_entries.borrow_mut();
        entries.push((entry, on_proxy));
        (
            table.dispatch_sync.clone(),
            table.wrap_host.clone(),
            entries.len() - 1,
        )
    };
    wrap_host.call((dispatch, id))
}

fn entry_id(args: &mut MultiValue) -> Option<usize> {
    match args.pop_front() {
        Some(Value::Integer(id)) => usize::try_from(id).ok(),
        _ => None,
    }
}

fn unknown() -> mlua::Error {
    mlua::Error::runtime("internal invariant violated: unknown host function")
}

fn make_sync_dispatcher(lua: &Lua) -> mlua::Result<Function> {
    lua.create_function(|lua, args: MultiValue| {
        let mut args = args;
        // Cloned out, so the entry may register or call host functions itself.
        let entry = entry_id(&mut args).and_then(|id| {
            lua.app_data_ref::<HostFns>()
                .and_then(|table| table.sync_entries.borrow().get(id).cloned())
        });
        match entry {
            Some((entry, on_proxy)) => {
                fill_before(lua, &args, usize::from(on_proxy))?;
                entry(lua, args)
            }
            None => Err(unknown()),
        }
    })
}

/// The async dispatcher, made while prompt code may have run. mlua loads the
/// coroutine library into the globals for it (the sandbox has none) and reads
/// `coroutine.yield` from there: give it the real library, never a global the
/// prompt set, and leave the prompt's `coroutine` global as it was.
fn dispatcher_beside_prompt_globals(lua: &Lua) -> mlua::Result<Function> {
    let globals = lua.globals();
    let prompts: Value = globals.raw_get("coroutine")?;
    let loaded: Option<mlua::Table> = lua.named_registry_value("_LOADED").ok();
    let real: Value = match &loaded {
        Some(loaded) => loaded.raw_get("coroutine")?,
        None => Value::Nil,
    };
    globals.raw_set("coroutine", real)?;
    let made = make_async_dispatcher(lua);
    globals.raw_set("coroutine", prompts)?;
    made
}

fn make_async_dispatcher(lua: &Lua) -> mlua::Result<Function> {
    lua.create_async_function(|lua, args: MultiValue| {
        let mut args = args;
        let entry = entry_id(&mut args).and_then(|id| {
            lua.app_data_ref::<HostFns>()
                .and_then(|table| table.async_entries.borrow().get(id).cloned())
        });
        let filled = fill_before(&lua, &args, 0);
        let future = match filled {
            Ok(()) => entry
                .map(|entry| entry(lua.clone(), args))
                .ok_or_else(unknown),
            Err(e) => Err(e),
        };
        async move {
            match future {
                Ok(future) => future.await,
                Err(e) => Err(e),
            }
        }
    })
}

/// The prelude's helper table (read here, not through `ctx`, so this module
/// stays a leaf).
fn helper_table(lua: &Lua) -> mlua::Result<mlua::Table> {
    lua.named_registry_value("pf.helpers")
}
