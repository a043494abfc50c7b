//! The cancel poll: a count hook that ends running Lua on a cancel or on a
//! run that ended on the spot, and the way to run the engine's own bounded
//! Lua without it.

use std::rc::Rc;

use mlua::{HookTriggers, Lua, VmState};

use crate::ctx::{section, SectionCtx};

/// How often the cancel flag is polled while Lua runs.
pub(crate) const CANCEL_POLL_INSTRUCTIONS: u32 = 10_000;

/// The cancel poll's check, run on the count events of a watched thread.
pub(crate) type PollCheck = Rc<dyn Fn(&Lua) -> mlua::Result<VmState>>;

/// The cancel poll: a count hook, on every thread of the VM (threads made
/// later inherit it), that ends the running Lua on a cancel or a run that
/// ended on the spot.
pub(crate) fn install_cancel_poll(lua: &Lua, sec: &SectionCtx) -> mlua::Result<()> {
    let poll = cancel_check(sec);
    lua.set_global_hook(
        HookTriggers::new().every_nth_instruction(CANCEL_POLL_INSTRUCTIONS),
        move |lua, _| poll(lua),
    )
}

/// The cancel poll's check, also run by a thread hook that watches more
/// (quiet.rs, a local handler's run in a tool loop).
pub(crate) fn cancel_check(sec: &SectionCtx) -> PollCheck {
    let cancel = sec.run.fixed.cancel.clone();
    let abort = sec.run.abort_signal();
    Rc::new(move |lua: &Lua| {
        if cancel.is_cancelled() {
            crate::vm::sandbox_guards::disarm_close_handlers(lua);
            Err(mlua::Error::runtime("interrupted by Ctrl-C"))
        } else if abort.is_cancelled() {
            // The run already ended on the spot; the walk reports why.
            crate::vm::sandbox_guards::disarm_close_handlers(lua);
            Err(mlua::Error::runtime("run ended"))
        } else {
            Ok(VmState::Continue)
        }
    })
}

/// Run `f` on the current thread without the cancel poll, which otherwise
/// sends every Lua instruction through Lua's hook dispatch. Only for the
/// engine's own Lua that is bounded by its input and can run no prompt code
/// (no metamethod, no callback; `models.loop`'s list read): a cancel that
/// arrives meanwhile is seen by whatever comes next (the model round's
/// `select`, or the poll in the next prompt instructions), as it would be
/// after a read the poll did not happen to interrupt. The poll is put back
/// on every exit, errors included.
pub(crate) fn without_cancel_poll<R>(lua: &Lua, f: impl FnOnce() -> R) -> R {
    struct Reinstall<'a>(&'a Lua);
    impl Drop for Reinstall<'_> {
        fn drop(&mut self) {
            let reinstalled = section(self.0).and_then(|sec| install_cancel_poll(self.0, &sec));
            if let Err(e) = reinstalled {
                tracing::error!("the cancel poll could not be put back: {e}");
            }
        }
    }
    if !crate::settings::fast(crate::settings::FastPath::HooklessEngineLua) {
        return f();
    }
    lua.remove_hook();
    let _reinstall = Reinstall(lua);
    f()
}
