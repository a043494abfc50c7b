//! The cancel poll: a count hook that ends running Lua on a cancel or on a
//! run that ended on the spot.

use std::rc::Rc;

use mlua::{HookTriggers, Lua, VmState};

use crate::ctx::SectionCtx;

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
