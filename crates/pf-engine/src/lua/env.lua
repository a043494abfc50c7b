-- Installs the `prose` global and keeps it working under a user metatable on _G.
local H = ...
-- The raw `next`: the global one is the ordered iterator, which sorts the keys on
-- every step (quadratic over a namespace, and this runs in every section VM).
local rawget, rawset, rawequal, type, next, error = H.rawget, H.rawset, H.rawequal, H.type, H.next, error; local LAZY = H.lazy_globals
local base_setmetatable, base_getmetatable = H.setmetatable, H.getmetatable
local G = _G

local PROSE_RO = 'prose is read-only: assign to `var` or a section global instead'
local ARGV_FROZEN = 'argv is frozen outside H1: assign it in H1 only'

-- The metatable the prompt installed on _G, if any. The one actually on _G
-- combines it with the `prose`/`argv` guards and is protected, so neither
-- getmetatable nor setmetatable ever reaches the guards themselves.
-- (`user_mt`, in the deferred part below)
local GUARDED = {}

local function build(mt)
  local combined = {}
  if mt then for k, v in next, mt do combined[k] = v end end
  local uindex = mt and rawget(mt, '__index')
  local unewindex = mt and rawget(mt, '__newindex')
  combined.__index = function(t, k)
    if k == 'prose' then return H.prose_read() end if LAZY[k] then return H.build_global(k) end
    if k == 'argv' and H.argv_frozen then if H.argv_pending then H.load_part('argv') end return H.argv_value end
    if uindex == nil then return nil end
    if type(uindex) == 'function' then return uindex(t, k) end
    return uindex[k]
  end
  combined.__newindex = function(t, k, v)
    if k == 'prose' then error(H.make_error('lua', PROSE_RO)) end if LAZY[k] then LAZY[k] = nil return rawset(t, k, v) end
    if k == 'argv' and H.argv_frozen then error(H.make_error('lua', ARGV_FROZEN)) end
    if unewindex == nil then return rawset(t, k, v) end
    if type(unewindex) == 'function' then return unewindex(t, k, v) end
    unewindex[k] = v
  end
  combined.__metatable = GUARDED
  return combined
end

-- The one metatable _G has for the VM's life: setmetatable could not replace a
-- protected metatable (and the VM has no debug library), so a new combination
-- is copied into it, the guards first. Their keys are always there, so those
-- writes cannot fail for memory, whatever the prompt left free.
local combined = build(nil) base_setmetatable(G, combined) H.env_combined, H.env_guarded, H.env_build = combined, GUARDED, build
--[==[ deferred env: (meta) the sandbox setmetatable/getmetatable's `_G` half, a second chunk of this name (vm/deferred.rs `Deferred`)
local H = ... local rawget, rawset, rawequal, type, next, error, base_setmetatable, base_getmetatable, G, combined, GUARDED, build, user_mt = H.rawget, H.rawset, H.rawequal, H.type, H.next, H.error, H.setmetatable, H.getmetatable, H.globals_table, H.env_combined, H.env_guarded, H.env_build, nil local function install(fresh)
  rawset(combined, '__index', rawget(fresh, '__index'))
  rawset(combined, '__newindex', rawget(fresh, '__newindex'))
  rawset(combined, '__metatable', GUARDED)
  -- (clearing fields during a traversal is allowed)
  for k in next, combined do
    if rawget(fresh, k) == nil then rawset(combined, k, nil) end
  end
  for k, v in next, fresh do rawset(combined, k, v) end
end

function H.env_setmetatable(t, mt)
  if rawequal(t, G) then
    if mt ~= nil and type(mt) ~= 'table' then
      error("bad argument #2 to 'setmetatable' (nil or table expected)", 2)
    end
    if user_mt ~= nil and rawget(user_mt, '__metatable') ~= nil then
      error('cannot change a protected metatable', 2)
    end
    local fresh = build(mt)
    user_mt = mt
    install(fresh)
    return t
  end local libs = H.lib_lazy if libs and libs[t] then H.fill_lib(t) end -- (a library's pending fields first: guards.lua)
  -- Lua's own refusals, raised at the caller's line as Lua's setmetatable
  -- raises them (never at a line of this chunk).
  if type(t) ~= 'table' then
    error("bad argument #1 to 'setmetatable' (table expected, got " .. (t == nil and 'no value' or type(t)) .. ')', 2)
  end
  if mt ~= nil and type(mt) ~= 'table' then
    error("bad argument #2 to 'setmetatable' (nil or table expected)", 2)
  end
  local ok, e = H.base_pcall(base_setmetatable, t, mt)
  if not ok then error(e, 2) end
  return t
end

function H.env_getmetatable(t)
  if rawequal(t, G) then
    if user_mt == nil then return nil end
    local shown = rawget(user_mt, '__metatable')
    if shown ~= nil then return shown end
    return user_mt
  end
  local libs = H.lib_lazy if libs and libs[t] then H.fill_lib(t) end return base_getmetatable(t)
end
--]==]
-- The sandbox has no coroutine library, whatever the runtime loaded for itself.
if rawget(G, 'coroutine') ~= nil then rawset(G, 'coroutine', nil) end
--[==[ deferred env: (globals) the guards of the globals built on first touch, a second chunk of this name (vm/deferred.rs `Deferred`)
-- Suspending calls are counted, so an error value raised again after a later one is
-- classified from its kind alone. The shared library's top-level code runs directly,
-- not as a block: there the calls that wait on the host, other than the store's,
-- refuse.
local H = ... local rawget, rawset, type, next, error, LAZY, G = H.rawget, H.rawset, H.type, H.next, H.error, H.lazy_globals, H.globals_table local function suspending(f, refuse_at_load)
  return function(...)
    if refuse_at_load and H.loading_shared then error('attempt to yield from outside a coroutine', 2) end
    H.suspends = H.suspends + 1
    return f(...)
  end
end
local function guard(t, name, refuse_at_load)
  if type(t) == 'table' and type(rawget(t, name)) == 'function' then
    rawset(t, name, suspending(rawget(t, name), refuse_at_load))
  end
end
local function guard_all(t, refuse_at_load)
  if type(t) ~= 'table' then return end
  local names = {}
  for k in next, t do names[#names + 1] = k end
  for i = 1, #names do guard(t, names[i], refuse_at_load) end
end
-- A global built on first touch is guarded as pf-syntax's `LUA_GLOBALS` says
-- its calls suspend (`how`, and the field `names`; vm/mod.rs `guard_spec`);
-- returns what `_G` gets.
function H.guard_global(v, how, names)
  if how == 'itself' then
    if type(v) == 'function' then return suspending(v, true) end
  elseif how == 'fields' then
    for i = 1, #names do guard(v, names[i], true) end
  elseif how == 'every' then
    guard_all(v, true)
  elseif how == 'every_at_load' then
    guard_all(v, false)
  end
  return v
end
-- Installs `n` built globals (name, value, how, field names: four slots each),
-- guarded, and clears them from the pending set.
function H.install_globals(list, n)
  for i = 1, 4 * n, 4 do
    local name = list[i]
    LAZY[name] = nil
    rawset(G, name, H.guard_global(list[i + 1], list[i + 2], list[i + 3]))
  end
end
--]==]
local next_raw = next
-- Library fields built on first touch: the guarded `string` and `table` functions (guards.lua's
-- part, and the prelude's `concat`) are absent from their library until a read of one
-- loads its part (vm/deferred.rs `Deferred`, with the memory limit lifted), which installs every field of
-- it still pending; a write clears a pending field as a raw write over the eager value would
-- have. Until the last one is built, the library's only metatable is LIB_MT. Whatever could see
-- a library's key set or its metatable builds them all first: the ordered `next`/`pairs`
-- (prelude `ordered_keys`), `getmetatable`/`setmetatable` (above) and the Rust fill
-- (vm/mod.rs `fill_lazy_globals`). Method calls on strings reach `string` through its own
-- `__index`, and so this one.
local S, T = string, table
local LIB_LAZY = { [S] = { find = 'guards', match = 'guards', gmatch = 'guards', gsub = 'guards', rep = 'guards' },
  [T] = { concat = 'base', move = 'guards', sort = 'guards', insert = 'guards', remove = 'guards' } }
H.lib_lazy = LIB_LAZY
H.c_libs = { find = S.find, match = S.match, gmatch = S.gmatch, gsub = S.gsub, sub = S.sub, rep = S.rep,
  move = T.move, sort = T.sort, insert = T.insert, remove = T.remove, string = S, table = T }
local function settle(t, pending)
  if next_raw(pending) == nil then
    LIB_LAZY[t] = nil
    base_setmetatable(t, nil)
  end
end
local LIB_MT = {
  __index = function(t, k)
    local pending = LIB_LAZY[t]
    local part = pending and pending[k]
    if part then H.load_part(part) return rawget(t, k) end
    return nil
  end,
  __newindex = function(t, k, v)
    local pending = LIB_LAZY[t]
    if pending and pending[k] then
      pending[k] = nil
      settle(t, pending)
    end
    rawset(t, k, v)
  end,
}
-- Called by a part as it loads: `t[k] = v` unless the prompt wrote `t[k]` first.
function H.install_lib(t, k, v)
  local pending = LIB_LAZY[t]
  if pending and pending[k] then
    pending[k] = nil
    rawset(t, k, v)
    settle(t, pending)
  end
end
-- Builds every pending field of `t`, if it is a library with any.
function H.fill_lib(t)
  local pending = LIB_LAZY[t]
  if pending == nil then return end
  for _, part in next_raw, pending do H.load_part(part) end
end
S.find, S.match, S.gmatch, S.gsub, S.rep, T.concat, T.move, T.sort, T.insert, T.remove = nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
base_setmetatable(S, LIB_MT)
base_setmetatable(T, LIB_MT)
