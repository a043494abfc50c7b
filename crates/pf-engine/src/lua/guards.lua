-- Sandbox guards (sandbox_guards/mod.rs): library functions that poll the
-- run's cancel, no `__gc` finalizers, `__close` handlers disarmed by a cancel. Runs after env.lua, before any
-- prompt code. `R.make(name)` makes each Rust half on first use; each returns (true, values...) or
-- (false, message, level), raised here at the prompt's call site.
-- Nothing here runs in every VM: each part below is loaded on first use (vm/deferred.rs `Deferred`), the
-- library fields through env.lua `LIB_MT`, the metatable functions as lazy globals.
--



--[==[ deferred guards: (strings) the guarded `string` functions, a second chunk of this name (vm/deferred.rs `Deferred`)
local H = ... local R, error, type, rawget, rawequal, select, tpack, tunpack, C = H.guard_raw, H.error, H.type, H.rawget, H.rawequal, H.select, H.tpack, H.tunpack, H.c_libs local ssub, raw_concat, S, T = C.sub, H.raw_tconcat, C.string, C.table -- (ck is tail-called, so level 2 is the prompt's frame, as luaL_error would place it)
local function ck(ok, ...)
  if ok then return ... end
  local message, level = ...
  error(message, level)
end

local raw_find, raw_match, raw_gmatch, raw_gsub, make_raw = nil, nil, nil, nil, R.make -- (made on first use)
local c_find, c_match, c_gmatch, c_gsub = C.find, C.match, C.gmatch, C.gsub
local math_type = H.math_type

-- Fast path: the C functions themselves where their worst case is provably
-- short (a subject no longer than the pattern's limit, valid arguments, a
-- pattern that cannot raise); everything else takes the polling matcher.
local subject_limit, step_budget = nil, R.c_step_budget
local limits, cached = {}, 0
local function limit_of(p)
  local limit = limits[p]
  if limit == nil then
    if cached >= 512 then limits, cached = {}, 0 end
    if not subject_limit then subject_limit = make_raw('c_subject_limit') end limit = subject_limit(p)
    limits[p] = limit
    cached = cached + 1
  end
  return limit
end
local function c_safe(s, p, init)
  return type(s) == 'string' and type(p) == 'string' and (init == nil or math_type(init) == 'integer')
    and #s <= limit_of(p)
end

local find = function(...)
  local s, p, init, plain = ...
  if plain and type(s) == 'string' and type(p) == 'string' and (init == nil or math_type(init) == 'integer') then
    if #s * (#p + 1) <= step_budget then return c_find(s, p, init, plain) end
  elseif c_safe(s, p, init) then
    return c_find(s, p, init, plain)
  end
  if not raw_find then raw_find = make_raw('find') end return ck(raw_find(...))
end
local match = function(...)
  local s, p, init = ...
  if c_safe(s, p, init) then return c_match(s, p, init) end
  if not raw_match then raw_match = make_raw('match') end return ck(raw_match(...))
end

local gmatch = function(...)
  local s, p, init = ...
  -- (gmatch has no anchor: a leading `^` would break the bound's start count)
  if c_safe(s, p, init) and ssub(p, 1, 1) ~= '^' then return c_gmatch(s, p, init) end
  if not raw_gmatch then raw_gmatch = make_raw('gmatch') end local ok, step, level = raw_gmatch(...)
  if not ok then error(step, level) end
  return function() return ck(step()) end
end

-- One step of gsub's Lua loop: the next match's span and its replacement value
-- (the function's first result, or the table's value at the first capture).
local function replace_one(repl, calls, ok, start, stop, ...)
  if not ok or start == nil then return ok, start, stop end
  if calls then return true, start, stop, (repl(...)) end
  return true, start, stop, repl[(...)]
end

local gsub = function(...)
  local s, p, repl, max = ...
  -- A replacement string without `%` cannot make C's gsub raise either.
  if type(repl) == 'string' and (max == nil or math_type(max) == 'integer') and c_safe(s, p, nil)
    and not c_find(repl, '%', 1, true) then
    return c_gsub(s, p, repl, max)
  end
  if not raw_gsub then raw_gsub = make_raw('gsub') end local ok, a, b, c = raw_gsub(...)
  if not ok then error(a, b) end
  if a ~= false then return a, b end
  -- A function or table makes each replacement: called here, so what it raises
  -- reaches the prompt unchanged and the count hook runs inside it.
  local step, s, repl = b, c, (select(3, ...))
  local calls = type(repl) == 'function'
  local parts, np, pos, n, changed = {}, 0, 1, 0, false
  while true do
    local ok, start, stop, v = replace_one(repl, calls, step())
    if not ok then error(start, stop) end
    if start == nil then break end
    n = n + 1
    if start > pos then np = np + 1; parts[np] = ssub(s, pos, start - 1) end
    np = np + 1
    if not v then
      parts[np] = ssub(s, start, stop - 1)
    else
      local tv = type(v)
      if tv ~= 'string' and tv ~= 'number' then
        error('invalid replacement value (a ' .. tv .. ')', 2)
      end
      parts[np] = v
      changed = true
    end
    pos = stop
  end
  if not changed then return s, n end
  np = np + 1; parts[np] = ssub(s, pos)
  return raw_concat(parts), n
end
-- string.rep: C's loop runs once per count whatever the piece's length, so
-- `string.rep('', math.maxinteger)` never returns and a short piece's time
-- follows the count. C only where both the count and the bytes are small; the
-- Rust half builds the rest by doubling, polling the cancel, within the VM's memory.
local c_rep, raw_rep, REP_C_COUNT, REP_C_BYTES = C.rep, nil, 1 << 16, 1 << 22
local rep = function(...)
  local s, n, sep = ...
  if type(s) == 'string' and math_type(n) == 'integer' and (sep == nil or type(sep) == 'string')
    and n <= REP_C_COUNT and (#s + (sep and #sep or 0)) * n <= REP_C_BYTES then
    if n <= 0 or #s + (sep and #sep or 0) > 0 then return c_rep(s, n, sep) end
  end
  if not raw_rep then raw_rep = make_raw('rep') end return ck(raw_rep(...))
end H.install_lib(S, 'find', find) H.install_lib(S, 'match', match) H.install_lib(S, 'gmatch', gmatch) H.install_lib(S, 'gsub', gsub) H.install_lib(S, 'rep', rep)
--]==]
--[==[ deferred guards: (tables) the guarded `table` functions, a second chunk of this name (vm/deferred.rs `Deferred`); table.move over chunks of the C function: between two chunks Lua runs
-- instructions again, so the count hook fires even for table.move({}, 1, 1e15, 2).
local H = ... local error, rawequal, C, make_raw, T = H.error, H.rawequal, H.c_libs, H.guard_raw.make, H.c_libs.table local c_move = C.move
-- (small enough that the hook, every 10 000 instructions, comes within a few
-- hundred thousand element moves: 4096 let a cancel wait over a second)
local CHUNK = 256
local move_plan = nil
local move = function(...)
  if not move_plan then move_plan = make_raw('move_plan') end local ok, a1, f, e, t, dest, given = move_plan(...)
  if not ok then error(a1, f) end
  if a1 == 'c' then return c_move(...) end
  if e < f then return dest end
  local n = e - f + 1
  if n <= CHUNK then
    c_move(a1, f, e, t, dest)
    return dest
  end
  if t > e or t <= f or (given and not (a1 == dest)) then
    local off = 0
    while off < n do
      local last = off + CHUNK - 1
      if last > n - 1 then last = n - 1 end
      c_move(a1, f + off, f + last, t + off, dest)
      off = last + 1
    end
  else
    local last = n - 1
    while last >= 0 do
      local first = last - CHUNK + 1
      if first < 0 then first = 0 end
      c_move(a1, f + first, f + last, t + first, dest)
      last = first - 1
    end
  end
  return dest
end

-- table.sort without a comparator over a large plain array of integers,
-- strings or floats sorts in Rust, polling the cancel; everything else is the
-- C sort (a comparator or metamethods run Lua code, where the hook fires).
-- The C sort runs under pcall, where it places its own "invalid order
-- function" error nowhere; raised again here at the prompt's call. Its
-- arguments were checked already, and what a comparator raises passes as is.
local c_sort, sort_plain = C.sort, nil
local guarded_pcall = H.sandbox_pcall
local INVALID_ORDER = 'invalid order function for sorting'
local sort = function(...)
  if not sort_plain then sort_plain = make_raw('sort_plain') end local ok, sorted, level = sort_plain(...)
  if not ok then error(sorted, level) end
  if sorted then return end
  local done, e = guarded_pcall(c_sort, ...)
  if done then return end
  if rawequal(e, INVALID_ORDER) then error(e, 2) end
  error(e, 0)
end

-- table.insert / table.remove shift every element between the position and
-- the length, in C, and a `__len` metamethod decides that length: with
-- `__len = function() return math.maxinteger end` C would shift for ever
-- without running an instruction. Such tables shift here, in Lua (reading and
-- writing through the same metamethods, `t[i]` as `lua_geti`/`lua_seti`),
-- where the count hook fires. Every other call is C's, whose work a real
-- length bounds: straight away when C cannot raise (a table without a
-- metatable, a valid position), else after the Rust half checked the
-- arguments as ltablib does (so a message names the prompt's call, not this one).
local c_insert, c_remove, type, select, math_type, base_getmetatable, shift_plan = C.insert, C.remove, H.type, H.select, H.math_type, H.getmetatable, nil
-- (the Rust half is called from the function the prompt called: its
-- messages take the name the prompt called it by from there)
local insert = function(...)
  local t, pos = ...
  local nargs = select('#', ...)
  if type(t) == 'table' and base_getmetatable(t) == nil and (nargs == 2
    or (nargs == 3 and math_type(pos) == 'integer' and pos >= 1 and pos <= #t + 1)) then
    return c_insert(...)
  end
  if not shift_plan then shift_plan = make_raw('shift_plan') end
  local ok, e, at = shift_plan('insert', type(t) == 'table' and #t or nil, ...)
  if not ok then error(e, at) end
  if e == 'c' then return c_insert(...) end
  for i = e, at + 1, -1 do t[i] = t[i - 1] end
  t[at] = (select(nargs, ...))
end
local remove = function(...)
  local t, pos = ...
  if type(t) == 'table' and base_getmetatable(t) == nil and (pos == nil
    or (math_type(pos) == 'integer' and pos >= 1 and pos <= #t + 1)) then
    return c_remove(...)
  end
  if not shift_plan then shift_plan = make_raw('shift_plan') end
  local ok, size, at = shift_plan('remove', type(t) == 'table' and #t or nil, ...)
  if not ok then error(size, at) end
  if size == 'c' then return c_remove(...) end
  local result = t[at]
  while at < size do
    t[at] = t[at + 1]
    at = at + 1
  end
  t[at] = nil
  return result
end H.install_lib(T, 'move', move) H.install_lib(T, 'sort', sort) H.install_lib(T, 'insert', insert) H.install_lib(T, 'remove', remove)
--]==]
-- No finalizers: Lua runs `__gc` with hooks off, so a looping one could never
-- be cancelled. Lua marks a table for finalization only when its metatable has
-- a `__gc` field at setmetatable time, so refusing that is enough.
--
-- To-be-closed variables: when the count hook raises a cancel, mlua truncates
-- the interrupted frame inside the hook, so that frame's `__close` handlers run
-- with hooks off. Every metatable a prompt can hold (each one it installs, each
-- one it reads back) is remembered weakly, in `H.watched_metatables` (made on
-- first use: most section entries never need it); before the hook raises, the
-- Rust half replaces each `__close` in them with `H.disarmed_close`, which returns at once
--[==[ deferred guards: (meta) the sandbox setmetatable/getmetatable, a second chunk of this name (vm/deferred.rs `Deferred`); (`disarm_close_handlers`). Until then nothing changes.
local H = ... local type, rawget, error, inner_setmetatable, inner_getmetatable = H.type, H.rawget, H.error, H.env_setmetatable, H.env_getmetatable
local watched = nil
local function watch(mt)
  if watched == nil then
    watched = inner_setmetatable({}, { __mode = 'k' })
    H.watched_metatables = watched
  end
  watched[mt] = true
end
H.disarmed_close = function() end
H.sandbox_setmetatable = function(t, mt)
  if type(mt) == 'table' then
    if rawget(mt, '__gc') ~= nil then
      error("bad argument #2 to 'setmetatable' (__gc metamethods are not allowed in prompts)", 2)
    end
    watch(mt)
  end
  return inner_setmetatable(t, mt)
end
H.sandbox_getmetatable = function(v)
  local mt = inner_getmetatable(v)
  if type(mt) == 'table' then watch(mt) end
  return mt
end
--]==]
