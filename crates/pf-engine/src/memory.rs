//! The run's memory budget: one account for the Lua heaps of every VM the run
//! holds at once (section VMs, `call` chains, fanout arms, task VMs), on top
//! of each VM's own memory ceiling (guide ch. 17).
//!
//! The bound holds by reservation: a live VM's mlua memory limit *is* its
//! reservation, and the reservations never sum past the budget, so the heaps
//! cannot either. The run is polled on one thread, so one VM runs Lua at a
//! time; before it runs, it claims headroom up to its ceiling, first from what
//! is free, then by shrinking every other VM to what it uses plus
//! [`PARKED_SLACK`]. A VM shrunk that way claims again before its Lua runs
//! next: on every poll of a suspending host call ([`claimed`]), and before a
//! block, a local tool handler or a compactor starts. An allocation the
//! reservation cannot hold fails the way the ceiling does, with Lua's
//! `not enough memory` (kind `lua`; run error kind `Lua`).

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;

use mlua::{Lua, WeakLua};

/// What a VM that is not running keeps beyond what it uses: room for the
/// engine's own small writes into it (events, bookkeeping) before it claims again.
pub(crate) const PARKED_SLACK: usize = 256 * 1024;

/// The budget's default: eight full section VMs (the fanout concurrency cap's
/// worth of VMs at the default ceiling).
pub const DEFAULT_RUN_MEMORY: usize = 512 * 1024 * 1024;

/// Lua's own text for a refused allocation (also what the sandbox `pcall`
/// recognises).
pub(crate) const MEMORY_ERROR: &str = "not enough memory";

/// The run-wide account.
pub(crate) struct MemoryAccount {
    budget: usize,
    ceiling: usize,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    /// The sum of every live VM's limit.
    reserved: usize,
    vms: Vec<Reservation>,
}

struct Reservation {
    lua: WeakLua,
    /// The reservation: the VM's Lua heap plus `host`.
    limit: usize,
    /// Host-side data the VM's entry holds and its reservation pays for
    /// (its `var`, [`hold`]); the VM's mlua limit is `limit - host - charged`.
    host: usize,
    /// Host-side data built on the VM's behalf and alive now ([`HostCharge`]s:
    /// tool arguments, a `models.loop` list's snapshots, a request in flight,
    /// a `string.rep` result before Lua copies it).
    charged: usize,
}

impl Reservation {
    /// The mlua limit this reservation leaves the VM's heap (never 0, which mlua reads as none).
    fn heap_limit(&self) -> usize {
        self.limit
            .saturating_sub(self.host)
            .saturating_sub(self.charged)
            .max(1)
    }
}

/// Kept in each VM's app data: ends the VM's reservation when the VM goes.
struct Member {
    account: Rc<MemoryAccount>,
    lua: WeakLua,
}

impl Drop for Member {
    fn drop(&mut self) {
        self.account.leave(&self.lua);
    }
}

impl MemoryAccount {
    pub(crate) fn new(budget: usize, ceiling: usize) -> Rc<Self> {
        Rc::new(MemoryAccount {
            budget: budget.max(1),
            ceiling: ceiling.max(1),
            state: RefCell::new(State::default()),
        })
    }

    /// One VM's memory ceiling: no VM's limit passes it, whatever the budget.
    pub(crate) fn ceiling(&self) -> usize {
        self.ceiling
    }

    /// Enter a freshly built VM into the account and give it its headroom.
    /// A VM already using more than it is granted (after a collection, as an
    /// allocation past the limit would have run) is refused with the memory
    /// error its next allocation would have raised; so is one the budget
    /// cannot hold at all.
    pub(crate) fn enter(self: &Rc<Self>, lua: &Lua) -> mlua::Result<()> {
        let weak = lua.weak();
        self.state.borrow_mut().vms.push(Reservation {
            lua: weak.clone(),
            limit: 0,
            host: 0,
            charged: 0,
        });
        lua.set_app_data(Member {
            account: Rc::clone(self),
            lua: weak,
        });
        let limit = self.claim_for(lua)?;
        if lua.used_memory() > limit {
            lua.gc_collect()?;
            if lua.used_memory() > limit {
                return Err(mlua::Error::MemoryError(MEMORY_ERROR.to_string()));
            }
        }
        Ok(())
    }

    fn leave(&self, lua: &WeakLua) {
        // A VM can go while the account is busy shrinking others (the shrink
        // loop holds their handles, never drops them under the borrow), so a
        // failed borrow cannot happen; if it ever did, the reservation would
        // only stay counted, never freed twice.
        if let Ok(mut state) = self.state.try_borrow_mut() {
            if let Some(i) = state.vms.iter().position(|r| &r.lua == lua) {
                let gone = state.vms.swap_remove(i);
                state.reserved = state.reserved.saturating_sub(gone.limit);
            }
        }
    }

    /// Give `lua` headroom up to its ceiling, as far as the budget allows;
    /// its heap's limit now (`usize::MAX` for a VM outside the account).
    fn claim_for(&self, lua: &Lua) -> mlua::Result<usize> {
        let me = lua.weak();
        // Upgraded handles of the other VMs live past the borrow, so dropping
        // one can never re-enter the account while it is borrowed.
        let mut others: Vec<Lua> = Vec::new();
        let limit = {
            let mut state = self.state.borrow_mut();
            let Some(mine) = state.vms.iter().position(|r| r.lua == me) else {
                return Ok(usize::MAX);
            };
            let current = state.vms[mine].limit;
            if current >= self.ceiling {
                return Ok(state.vms[mine].heap_limit());
            }
            let need = self.ceiling - current;
            if self.budget.saturating_sub(state.reserved) < need {
                let State { reserved, vms } = &mut *state;
                for (i, other) in vms.iter_mut().enumerate() {
                    if i == mine {
                        continue;
                    }
                    let Some(handle) = other.lua.try_upgrade() else {
                        continue;
                    };
                    let keep = handle
                        .used_memory()
                        .saturating_add(PARKED_SLACK)
                        .saturating_add(other.host)
                        .saturating_add(other.charged);
                    if keep < other.limit {
                        *reserved -= other.limit - keep;
                        other.limit = keep;
                        handle.set_memory_limit(other.heap_limit())?;
                    }
                    others.push(handle);
                }
            }
            let grant = need.min(self.budget.saturating_sub(state.reserved));
            state.reserved += grant;
            state.vms[mine].limit = current + grant;
            state.vms[mine].heap_limit()
        };
        lua.set_memory_limit(limit)?;
        drop(others);
        Ok(limit)
    }

    /// Make the VM `lua`'s reservation pay for `bytes` of host-side data
    /// (replacing what it paid for before): its heap's limit shrinks by as
    /// much. Refused with the memory error, and nothing changed, when the
    /// heap already uses more than the smaller limit would leave it.
    fn hold_for(&self, lua: &Lua, bytes: usize) -> mlua::Result<()> {
        self.claim_for(lua)?;
        let me = lua.weak();
        let limit = {
            let mut state = self.state.borrow_mut();
            let Some(mine) = state.vms.iter().position(|r| r.lua == me) else {
                return Ok(());
            };
            let r = &mut state.vms[mine];
            if r.limit.saturating_sub(bytes).saturating_sub(r.charged) <= lua.used_memory()
                && bytes > r.host
            {
                return Err(mlua::Error::MemoryError(MEMORY_ERROR.to_string()));
            }
            r.host = bytes;
            r.heap_limit()
        };
        lua.set_memory_limit(limit)?;
        Ok(())
    }
    /// Charge `bytes` more host-side data to the VM `lua`'s reservation: its
    /// heap's limit shrinks by as much. Refused with the memory error, and
    /// nothing charged, when the heap already uses more than that leaves it
    /// (after one collection, as Lua's own allocator would try).
    fn charge_for(&self, lua: &Lua, bytes: usize) -> mlua::Result<()> {
        self.claim_for(lua)?;
        let me = lua.weak();
        let fits = |state: &State| {
            state.vms.iter().find(|r| r.lua == me).is_none_or(|r| {
                r.limit
                    .saturating_sub(r.host)
                    .saturating_sub(r.charged)
                    .checked_sub(bytes)
                    .is_some_and(|left| left > lua.used_memory())
            })
        };
        if !fits(&self.state.borrow()) {
            lua.gc_collect()?;
            if !fits(&self.state.borrow()) {
                return Err(mlua::Error::MemoryError(MEMORY_ERROR.to_string()));
            }
        }
        let limit = {
            let mut state = self.state.borrow_mut();
            let Some(r) = state.vms.iter_mut().find(|r| r.lua == me) else {
                return Ok(());
            };
            r.charged += bytes;
            r.heap_limit()
        };
        lua.set_memory_limit(limit)?;
        Ok(())
    }

    /// Return `bytes` a [`HostCharge`] held for the VM `lua` (gone or not).
    fn release(&self, lua: &WeakLua, bytes: usize) {
        let limit = match self.state.try_borrow_mut() {
            Ok(mut state) => match state.vms.iter_mut().find(|r| &r.lua == lua) {
                Some(r) => {
                    r.charged = r.charged.saturating_sub(bytes);
                    r.heap_limit()
                }
                None => return,
            },
            Err(_) => return,
        };
        if let Some(handle) = lua.try_upgrade() {
            // Raising a limit cannot fail for want of memory.
            let _ = handle.set_memory_limit(limit);
        }
    }
}

/// What a [`HostCharge`] reserves at a time beyond what it was asked for, so
/// builders that charge string by string touch the account rarely.
const CHARGE_STEP: usize = 64 * 1024;

/// Host-side data the host builds on a VM's behalf (JSON converted from its
/// tables, a message list's snapshots, a request body in flight, a guard's
/// result before Lua copies it), paid for by that VM's reservation while this
/// lives: the one path such builders take, so the VM's ceiling and the run's
/// budget hold for what they build, and a build past them fails with the
/// memory error as it grows, never after. Outside any account it only counts.
pub(crate) struct HostCharge {
    account: Option<(Rc<MemoryAccount>, WeakLua)>,
    /// What is in use; `reserved - used` is charged ahead.
    used: usize,
    reserved: usize,
}

impl HostCharge {
    /// An empty charge against the VM `lua`'s reservation.
    pub(crate) fn new(lua: &Lua) -> HostCharge {
        let account = lua
            .app_data_ref::<Member>()
            .map(|member| (Rc::clone(&member.account), lua.weak()));
        HostCharge {
            account,
            used: 0,
            reserved: 0,
        }
    }

    /// A charge against no VM: it only counts (engine data, unit tests).
    pub(crate) fn unaccounted() -> HostCharge {
        HostCharge {
            account: None,
            used: 0,
            reserved: 0,
        }
    }

    /// Count `bytes` more; the memory error when the VM cannot pay for them.
    pub(crate) fn add(&mut self, bytes: usize) -> mlua::Result<()> {
        let used = self.used.saturating_add(bytes);
        if used > self.reserved {
            if let Some((account, weak)) = &self.account {
                let Some(lua) = weak.try_upgrade() else {
                    return Err(mlua::Error::MemoryError(MEMORY_ERROR.to_string()));
                };
                let step = (used - self.reserved).max(CHARGE_STEP);
                match account.charge_for(&lua, step) {
                    Ok(()) => self.reserved += step,
                    // Near the limit, the step itself may be what does not fit.
                    Err(_) if step > used - self.reserved => {
                        account.charge_for(&lua, used - self.reserved)?;
                        self.reserved = used;
                    }
                    Err(e) => return Err(e),
                }
            } else {
                self.reserved = used;
            }
        }
        self.used = used;
        Ok(())
    }

    /// Count exactly `bytes` from now on (what is held shrank or grew).
    pub(crate) fn set(&mut self, bytes: usize) -> mlua::Result<()> {
        if bytes >= self.used {
            return self.add(bytes - self.used);
        }
        self.used = bytes;
        let spare = self.reserved - self.used;
        if spare > CHARGE_STEP {
            if let Some((account, weak)) = &self.account {
                account.release(weak, spare);
            }
            self.reserved = self.used;
        }
        Ok(())
    }

    /// What is counted now.
    pub(crate) fn bytes(&self) -> usize {
        self.used
    }
}

impl Drop for HostCharge {
    fn drop(&mut self) {
        if let Some((account, weak)) = &self.account {
            if self.reserved > 0 {
                account.release(weak, self.reserved);
            }
        }
    }
}

/// Claim headroom for the VM `lua` before its Lua runs (a no-op for a Lua
/// state outside any account).
pub(crate) fn claim(lua: &Lua) -> mlua::Result<()> {
    let account = match lua.app_data_ref::<Member>() {
        Some(member) => Rc::clone(&member.account),
        None => return Ok(()),
    };
    account.claim_for(lua).map(|_| ())
}

/// Have the VM `lua`'s reservation pay for `bytes` of host-side data its
/// entry holds (the entry's `var`), in place of what it paid for before: the
/// VM's heap may use that much less. The memory error when the heap already
/// uses more than that leaves it. A no-op for a Lua state outside any account.
pub(crate) fn hold(lua: &Lua, bytes: usize) -> mlua::Result<()> {
    let account = match lua.app_data_ref::<Member>() {
        Some(member) => Rc::clone(&member.account),
        None => return Ok(()),
    };
    account.hold_for(lua, bytes)
}

/// What the VM `lua` may still allocate: its limit (its reservation, claimed
/// anew first) less what it uses; `usize::MAX` for a Lua state outside any
/// account. Text the host builds for a VM, or on a prompt's behalf, must fit
/// here: it ends in the VM's heap or stands for what the VM could have held,
/// so a prompt cannot make the host hold what its VM could not.
pub(crate) fn headroom(lua: &Lua) -> usize {
    let account = match lua.app_data_ref::<Member>() {
        Some(member) => Rc::clone(&member.account),
        None => return usize::MAX,
    };
    match account.claim_for(lua) {
        Ok(limit) => limit.saturating_sub(lua.used_memory()),
        Err(_) => 0,
    }
}

/// `fut`, claiming headroom for `lua` at every poll: whatever ran while it
/// was waiting may have shrunk this VM to what it used.
pub(crate) async fn claimed<F: Future>(lua: &Lua, fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Err(e) = claim(lua) {
            tracing::warn!("memory claim failed: {e}");
        }
        fut.as_mut().poll(cx)
    })
    .await
}

/// True when `e` is Lua's refusal of an allocation (the ceiling or the budget).
pub(crate) fn is_memory_error(e: &mlua::Error) -> bool {
    match e {
        mlua::Error::MemoryError(_) => true,
        mlua::Error::CallbackError { cause, .. } | mlua::Error::WithContext { cause, .. } => {
            is_memory_error(cause)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(account: &Rc<MemoryAccount>) -> Lua {
        let lua = Lua::new();
        account.enter(&lua).unwrap();
        lua
    }

    fn grow(lua: &Lua, mib: usize) -> mlua::Result<()> {
        lua.load(format!("KEEP = string.rep('x', {mib} * 1024 * 1024)"))
            .exec()
    }

    #[test]
    fn the_reservations_never_pass_the_budget() {
        let account = MemoryAccount::new(24 << 20, 8 << 20);
        let vms: Vec<Lua> = (0..6).map(|_| vm(&account)).collect();
        let mut held = 0;
        for lua in &vms {
            claim(lua).unwrap();
            if grow(lua, 5).is_ok() {
                held += 1;
            }
        }
        let used: usize = vms.iter().map(Lua::used_memory).sum();
        assert!(used <= 24 << 20, "{used}");
        assert!(
            (3..=4).contains(&held),
            "at most four 5 MiB heaps fit in 24 MiB: {held}"
        );
        assert!(account.state.borrow().reserved <= 24 << 20);
    }

    #[test]
    fn a_vm_that_goes_returns_its_reservation() {
        let account = MemoryAccount::new(16 << 20, 8 << 20);
        let a = vm(&account);
        grow(&a, 6).unwrap();
        let b = vm(&account);
        assert!(grow(&b, 12).is_err(), "the ceiling holds");
        drop(a);
        claim(&b).unwrap();
        grow(&b, 6).unwrap();
        drop(b);
        assert_eq!(account.state.borrow().reserved, 0);
        assert!(account.state.borrow().vms.is_empty());
    }

    #[test]
    fn host_data_a_vm_holds_comes_out_of_its_heap() {
        let account = MemoryAccount::new(16 << 20, 8 << 20);
        let a = vm(&account);
        hold(&a, 5 << 20).unwrap();
        assert!(headroom(&a) < 3 << 20, "{}", headroom(&a));
        assert!(grow(&a, 4).is_err(), "5 MiB held leaves less than 4 MiB");
        grow(&a, 2).unwrap();
        assert!(hold(&a, 7 << 20).is_err(), "the heap already uses 2 MiB");
        hold(&a, 1 << 20).unwrap();
        a.load("KEEP = nil").exec().unwrap();
        a.gc_collect().unwrap();
        grow(&a, 6).unwrap();
    }

    #[test]
    fn the_ceiling_alone_holds_without_pressure() {
        let account = MemoryAccount::new(DEFAULT_RUN_MEMORY, 8 << 20);
        let a = vm(&account);
        assert!(grow(&a, 9).is_err());
        grow(&a, 4).unwrap();
    }
}
