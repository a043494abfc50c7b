-- Runs once in every fresh section VM, before anything else, with the full
-- base library still present. It captures what the engine's own Lua helpers
-- need, installs the deterministic pairs/next, then removes every global the
-- sandbox does not allow. Returns the helper table the engine keeps.
-- The VM has no debug library: what the helpers need of it (a metatable behind
-- `__metatable`, an error's place and traceback) the engine gives from Rust, in
-- `H.metafield` and `H.error_place` (sandbox_guards/introspect.rs).
local H = ...
local rawget, rawset, rawequal, rawlen, next = rawget, rawset, rawequal, rawlen, next; local GLOBALS = _G
local type, error, select, tostring, pcall, xpcall = type, error, select, tostring, pcall, xpcall
local setmetatable, getmetatable = setmetatable, getmetatable
local error_place = H.error_place local tsort, tpack, tunpack = table.sort, table.pack, table.unpack -- (`H.math_type`: vm/deferred.rs `math_library`)
--[==[ deferred base: (metafield) the raw field `name` of v's metatable, past any `__metatable`; only the part's own functions use it
local H = ... local getmetatable, rust_metafield = H.getmetatable, H.metafield -- A value `getmetatable` gives nil for has no metatable at all, so most calls stay here.
local function metafield(v, name)
  if getmetatable(v) == nil then return nil end
  return rust_metafield(v, name)
end H.metafield_lua = metafield
--]==]
-- (`H.utf8_len` too, for the ordered `pairs`; no VM opens `utf8` for the prompt)
local collectgarbage = collectgarbage
local WEAK_KEYS = { __mode = 'k' } -- (one metatable for every weak-keyed table here)
--[==[ deferred base: (errors) the error values, a second chunk of this name (vm/deferred.rs `Deferred`)
-- Only values the engine built classify as host errors: GENUINE maps each one
-- (weakly) to a snapshot of its fields as built, and nothing a prompt can reach
-- writes it. The metatable is protected so a prompt can neither take it nor
-- strip it; a table carrying it, or a genuine value whose fields were edited,
-- is the prompt's own value and ends a block as a plain Lua error.
local H = ... local setmetatable, rawget, rawset, next, WEAK_KEYS, type, error = H.setmetatable, H.rawget, H.rawset, H.next, H.weak_keys, H.type, H.error local GENUINE = setmetatable({}, WEAK_KEYS) -- (one metatable for every weak-keyed table here)
H.genuine = GENUINE H.run_kinds, H.located, H.born = setmetatable({}, WEAK_KEYS), setmetatable({}, WEAK_KEYS), setmetatable({}, WEAK_KEYS) -- (error.rs's bookkeeping, below)
local ERR_MT = {}
ERR_MT.__tostring = function(e) return rawget(e, 'message') end
-- (The engine gives ERR_MT to exactly the values in GENUINE, and no prompt can
-- take it or remove it.)
ERR_MT.__concat = function(a, b)
  if GENUINE[a] ~= nil then a = rawget(a, 'message') end
  if GENUINE[b] ~= nil then b = rawget(b, 'message') end
  -- (Lua's own refusal, at the prompt's line: not a line of this chunk.)
  local ta, tb = type(a), type(b)
  if ta ~= 'string' and ta ~= 'number' then error('attempt to concatenate a ' .. ta .. ' value', 2) end
  if tb ~= 'string' and tb ~= 'number' then error('attempt to concatenate a ' .. tb .. ' value', 2) end
  return a .. b
end
ERR_MT.__name = 'error value'
ERR_MT.__metatable = false
H.ERR_MT = ERR_MT

function H.make_error(kind, message, fields)
  local e = { kind = kind, message = message }
  if fields then for k, v in next, fields do rawset(e, k, v) end end
  local snapshot = {}
  for k, v in next, e do snapshot[k] = v end
  GENUINE[e] = snapshot
  return setmetatable(e, ERR_MT)
end
--]==]
function H.make_error(...) H.load_part('base') return H.make_error(...) end -- (until the part is in)
-- Host calls return (true, ...) or (false, err): raise the error value here so
-- pcall sees exactly the value the host built. Level 0: a string here is an
-- error Lua code raised (a local tool's handler) that already says where it
-- happened; another position would name this call's line in front of it.
local function check(ok, ...)
  if ok then return ... end
  -- (Host memory refused for the prompt is Lua's memory error, raised as Lua
  -- raises it: no position, as every error here.)
  error((...), 0)
end
-- (The closures below have the shape the one-off `H.wrap(raw)` gave each host
-- function before the dispatchers: `function(...) return check(raw(...)) end`.)
--
--
-- Host functions share one sync and one async dispatcher per VM (vm/hostfn/dispatch.rs).
function H.wrap_host(dispatch, id)
  return function(...) return check(dispatch(id, ...)) end
end
function H.wrap_async(id)
  return function(...)
    local dispatch = H.dispatch_async or H.make_async_dispatch()
    if not dispatch then error('not enough memory', 0) end
    return check(dispatch(id, ...))
  end
end

--[==[ deferred base: (iter) the ordered `next`/`pairs`, a second chunk of this name (vm/deferred.rs `Deferred`)
local H = ... local type, error, rawget, rawequal, rawlen, next, math_type, tsort, utf8_len, metafield, GLOBALS = H.type, H.error, H.rawget, H.rawequal, H.rawlen, H.next, H.math_type, H.tsort, H.utf8_len, H.metafield_lua, H.globals_table local function key_class(k) -- Deterministic iteration
  local t = type(k)
  if t == 'boolean' then return 1 end
  if t == 'number' then
    if k ~= k or k == 1 / 0 or k == -1 / 0 then return 4 end -- (not `math.huge`: the prompt may rebind `math`)
    return 2
  end
  if t == 'string' then
    if utf8_len(k) == nil then return 4 end
    return 3
  end
  return 4
end
local function key_less(a, b)
  local ca, cb = key_class(a), key_class(b)
  if ca ~= cb then return ca < cb end
  if ca == 1 then return (not a) and b end
  if ca == 2 or ca == 3 then return a < b end
  return false
end
local function ordered_keys(t) local lazy = rawequal(t, GLOBALS) and H.lazy_globals if lazy and next(lazy) ~= nil then H.fill_globals() end local libs = H.lib_lazy if libs and libs[t] then H.fill_lib(t) end
  local n = rawlen(t)
  local keys, others = {}, {}
  for i = 1, n do
    if rawget(t, i) ~= nil then keys[#keys + 1] = i end
  end
  local k = next(t)
  while k ~= nil do
    if not (math_type(k) == 'integer' and k >= 1 and k <= n) then others[#others + 1] = k end
    k = next(t, k)
  end
  -- the trailing group keeps a stable but unspecified order; sort only scalars
  local scalars, trailing = {}, {}
  for i = 1, #others do
    if key_class(others[i]) == 4 then trailing[#trailing + 1] = others[i] else scalars[#scalars + 1] = others[i] end
  end
  tsort(scalars, key_less)
  for i = 1, #scalars do keys[#keys + 1] = scalars[i] end
  for i = 1, #trailing do keys[#keys + 1] = trailing[i] end
  return keys
end
H.ordered_keys = ordered_keys

-- The position in `keys` where stepping continues after `k`, a key that is no
-- longer in the table (it was cleared during the walk). `n` is the array border.
local function resume_after_cleared(t, keys, k, n)
  if math_type(k) == 'integer' and k >= 1 then
    -- Treated as an array index: later array slots, then every other key from the start.
    for i = 1, #keys do
      local key = keys[i]
      local in_array = math_type(key) == 'integer' and key >= 1 and key <= n
      if not in_array or key > k then return i end
    end
    return #keys + 1
  end
  local ck = key_class(k)
  for i = 1, #keys do
    local key = keys[i]
    local in_array = math_type(key) == 'integer' and key >= 1 and key <= n
    if not in_array then
      if ck == 4 then
        -- an unordered key: resume at the trailing group
        if key_class(key) == 4 then return i end
      elseif key_less(k, key) then
        return i
      end
    end
  end
  return #keys + 1
end

local function ordered_next(t, k)
  if type(t) ~= 'table' then
    error("bad argument #1 to 'next' (table expected, got " .. type(t) .. ")", 2)
  end
  local keys = ordered_keys(t)
  local start = 1
  if k ~= nil then
    start = nil
    for i = 1, #keys do
      if rawequal(keys[i], k) then start = i + 1 break end
    end
    if start == nil then start = resume_after_cleared(t, keys, k, rawlen(t)) end
  end
  for i = start, #keys do
    local v = rawget(t, keys[i])
    if v ~= nil then return keys[i], v end
  end
  return nil, nil
end

local function ordered_pairs(t)
  if type(t) ~= 'table' then
    error("bad argument #1 to 'pairs' (table expected, got " .. type(t) .. ")", 2)
  end
  local mp = metafield(t, '__pairs')
  if mp ~= nil then
    if type(mp) ~= 'function' then
      error("attempt to call a " .. type(mp) .. " value (metamethod '__pairs')", 2)
    end
    return mp(t)
  end
  local keys = ordered_keys(t)
  local i = 0
  local function iter()
    while true do
      i = i + 1
      local key = keys[i]
      if key == nil then return nil, nil end
      local v = rawget(t, key)
      if v ~= nil then return key, v end
    end
  end
  return iter, t, nil
end H.ordered_next, H.ordered_pairs = ordered_next, ordered_pairs
--]==]
--[==[ deferred base: (pcall) the sandbox pcall/xpcall (vm/deferred.rs `Deferred`): running past the memory ceiling comes back as a `lua` error value
-- (Lua itself raises a bare string); everything else comes back exactly as raised.
-- A cancel needs nothing here: the instruction hook raises again at the next poll.
local H = ... local type, error, rawequal, collectgarbage, pcall, xpcall = H.type, H.error, H.rawequal, H.collectgarbage, H.base_pcall, H.base_xpcall local MEMORY = 'not enough memory'
local function memory_error()
  collectgarbage('collect')
  return H.make_error('lua', MEMORY)
end
-- After a host cancel nothing may swallow the interrupt: raise it on, past every pcall.
local function check_cancel(e)
  local cancelled = H.cancelled
  if cancelled and cancelled() then error(e, 0) end
end
local function caught(ok, ...)
  if not ok then
    check_cancel((...))
    if rawequal((...), MEMORY) then return false, memory_error() end
  end
  return ok, ...
end
local base_pcall, base_xpcall = pcall, xpcall
local function sandbox_pcall(f, ...)
  return caught(base_pcall(f, ...))
end
local function sandbox_xpcall(f, handler, ...)
  if type(handler) ~= 'function' then return caught(base_xpcall(f, handler, ...)) end
  return caught(base_xpcall(f, function(e)
    -- After a cancel the prompt's handler is not entered: an error the count hook
    -- raised runs the handler with hooks off, so a looping one could not be stopped.
    local cancelled = H.cancelled
    if cancelled and cancelled() then return e end
    if rawequal(e, MEMORY) then e = memory_error() end
    return handler(e)
  end, ...))
end H.sandbox_pcall, H.sandbox_xpcall = sandbox_pcall, sandbox_xpcall
--]==]
-- Block runner: returns true, results... or false, error value, line info.
function H.run_block(f, ...)
  local where_src, where_line, trace
  local function handler(e)
    -- the innermost prompt line under the handler, and the traceback from there
    where_src, where_line, trace = error_place()
    return e
  end
  local r = tpack(xpcall(f, handler, ...))
  if r[1] then return true, tpack(tunpack(r, 2, r.n)) end
  return false, r[2], where_src, where_line, trace
end
function H.pcall_values(f, ...)
  local r = tpack(pcall(f, ...))
  if r[1] then return true, tpack(tunpack(r, 2, r.n)) end
  return false, r[2]
end
--[==[ deferred loop: models.loop's list helpers, a second chunk of this name (vm/deferred.rs `Deferred`)
local H = ... local type, math_type, next, rawequal, rawlen, rawget, rawset, select = H.type, H.math_type, H.next, H.rawequal, H.rawlen, H.rawget, H.rawset, H.select
-- A message list's shape for models.loop, which reads its whole list every round (walking
-- it here is far cheaper than key by key from Rust): whether every key and value is a string,
-- number, boolean or table, with no cycle and at most `max` levels, then its length when its keys are exactly 1..n (else nil).
local function representable(t, path, depth, max)
  if depth > max or path[t] then return false end
  path[t] = true
  for k, v in next, t do
    local tk, tv = type(k), type(v)
    if not (tk == 'string' or tk == 'number' or tk == 'boolean'
        or (tk == 'table' and representable(k, path, depth + 1, max))) then
      return false
    end
    if not (tv == 'string' or tv == 'number' or tv == 'boolean'
        or (tv == 'table' and representable(v, path, depth + 1, max))) then
      return false
    end
  end
  path[t] = nil
  return true
end
function H.list_shape(list, max)
  if not representable(list, {}, 0, max) then return false, nil end
  local count, top = 0, 0
  for k in next, list do
    if math_type(k) ~= 'integer' or k < 1 then return true, nil end
    count = count + 1
    if k > top then top = k end
  end
  if count ~= top then return true, nil end
  return true, count
end

-- models.loop reads its list every round (namespaces/models_check.rs `ListReader`). A
-- snapshot of each record read, `snaps[i]`, lets the next read prove record i
-- unchanged without Rust reading it again. A snapshot is a flat array of nodes,
-- one per table of the record (the record first, then each table met in its
-- pairs, depth first), and at [0] the position after the last node. A node is
-- the table, its raw length when its integer keys are not exactly 1..n (only
-- then can the length change with the contents unchanged), the position of
-- its closing triple, then per pair how it compares, the key and the value,
-- then a closing triple no further pair can match. How a pair compares: a
-- table key, with `rawequal` and subtype and zero sign for a number value
-- (true); a table value, with `rawequal` ('table'); a number value, by value,
-- subtype and zero sign (its subtype); anything else with `==` (false). `==`
-- calls no metamethod unless both sides are tables (or both userdata), and
-- the snapshot's side of such a pair never is. Equal `next` sequences of
-- every table of a record give equal reads, the layout-dependent raw length
-- aside, which is compared. A node's table is the one its parent's pair
-- proved the value, so the nodes are checked in turn, without recursion.
-- Nothing here can run prompt code (raw access only, no metamethod), so the
-- a cancel is seen by the poll as in any other Lua (vm/cancel.rs).
local NAN = 0 / 0
local function snap_node(t, s, n)
  local head = n
  s[head + 1] = t
  n = head + 3
  local first, ints, top = n, 0, 0
  for k, v in next, t do
    local f = false
    if type(k) == 'table' then
      f = true
    elseif type(v) == 'table' then
      f = 'table'
    else
      f = math_type(v) or false
    end
    s[n + 1], s[n + 2], s[n + 3] = f, k, v
    n = n + 3
    if math_type(k) == 'integer' then
      ints = ints + 1
      if k > top then top = k end
    end
  end
  -- A pair past the last one meets this: NaN equals no key.
  s[n + 1], s[n + 2], s[n + 3] = false, NAN, NAN
  s[head + 2] = ints ~= top and rawlen(t)
  s[head + 3] = n + 1
  local last = n
  n = n + 3
  for i = first + 2, last, 3 do
    local k, v = s[i], s[i + 1]
    if type(k) == 'table' then n = snap_node(k, s, n) end
    if type(v) == 'table' then n = snap_node(v, s, n) end
  end
  return n
end
local function snap_record(record)
  local s = {}
  s[0] = snap_node(record, s, 0)
  return s
end
local function same_number(a, b)
  if math_type(a) ~= math_type(b) then return false end
  return a ~= 0 or 1 / a == 1 / b
end
-- Whether every table of a record is as snapshotted: each node in turn (a
-- parent's pair already proved each child node's table is the value it holds).
local function same_record(s)
  local n, stop = 0, s[0]
  repeat
    local t, len, last = s[n + 1], s[n + 2], s[n + 3]
    if len and rawlen(t) ~= len then return false end
    local i = n + 4
    for k, v in next, t do
      local f = s[i]
      if not f then
        if k ~= s[i + 1] or v ~= s[i + 2] then return false end
      elseif f == 'table' then
        if k ~= s[i + 1] or not rawequal(v, s[i + 2]) then return false end
      elseif f == true then
        local sv = s[i + 2]
        if not rawequal(k, s[i + 1]) or not rawequal(v, sv) then return false end
        if math_type(sv) and not same_number(v, sv) then return false end
      else
        local sv = s[i + 2]
        if k ~= s[i + 1] or v ~= sv or math_type(v) ~= f then return false end
        if sv == 0 and f == 'float' and 1 / v ~= 1 / sv then return false end
      end
      i = i + 3
    end
    if i ~= last then return false end
    n = i + 2
  until n >= stop
  return true
end
-- `list_shape`'s answers (representable, length) plus the first index whose
-- record is not proven unchanged since the last call with `snaps` (which held
-- `known` records); `snaps` is brought up to date when the list is a sequence.
-- `trusted`: no prompt code ran since that call (only the engine appended), so
-- the list and its records are as then (the snapshots keep their tables from
-- collection) with the appended records after them.
function H.list_read(list, max, snaps, known, trusted)
  local path = { [list] = true }
  local count, top, seq = 0, 0, true
  local first = nil
  if trusted and known > 0 then
    -- The list is the sequence of `known` records read last time, plus what
    -- the engine appended since (raw, at the length plus one): only those
    -- need reading, and the keys past them are none.
    top = known
    while true do
      local v = rawget(list, top + 1)
      if v == nil then break end
      local tv = type(v)
      if not (tv == 'string' or tv == 'number' or tv == 'boolean'
          or (tv == 'table' and representable(v, path, 1, max))) then
        return false, nil, 0
      end
      top = top + 1
    end
    count, first = top, known + 1
  else for k, v in next, list do
    local s = snaps[k]
    if s and rawequal(s[1], v) and (trusted or same_record(s)) then
      -- Only the integers 1..known index `snaps`.
      count = count + 1
      if k > top then top = k end
    else
      local tk, tv = type(k), type(v)
      if not (tk == 'string' or tk == 'number' or tk == 'boolean'
          or (tk == 'table' and representable(k, path, 1, max))) then
        return false, nil, 0
      end
      if not (tv == 'string' or tv == 'number' or tv == 'boolean'
          or (tv == 'table' and representable(v, path, 1, max))) then
        return false, nil, 0
      end
      if math_type(k) ~= 'integer' or k < 1 then
        seq = false
      else
        count = count + 1
        if k > top then top = k end
        if not first or k < first then first = k end
      end
    end
  end end
  if not seq or count ~= top then return true, nil, 0 end
  first = first or top + 1
  for i = first, top do
    local record = rawget(list, i)
    local s = nil
    -- A record that is not a table fails the read in Rust.
    if type(record) == 'table' then s = snap_record(record) end
    snaps[i] = s
  end
  for i = top + 1, known do snaps[i] = nil end
  return true, count, first
end
-- A tool round's records, appended to `list` as the engine's Rust built them
-- before (the same tables from the same sets in the same order, so the same
-- layouts): the assistant record `{ role, content, tool_calls }` with a call
-- `{ id, name, arguments }` per call, then a `{ role, content, tool_call_id }`
-- per result; `...` is `id, name, arguments, result` per call. Each is also
-- put in `held` (namespaces/models_check.rs `ListReader`), which holds them until a read
-- snapshots them. Raw sets only, on tables made here: no prompt code.
function H.append_round(list, held, content, ...)
  local rec = {}
  rec.role = 'assistant'
  rec.content = content
  local calls = {}
  local n = select('#', ...)
  for i = 1, n, 4 do
    local id, name, arguments = select(i, ...)
    local call = {}
    call.id = id
    call.name = name
    call.arguments = arguments
    calls[(i + 3) // 4] = call
  end
  rec.tool_calls = calls
  local h = rawlen(held)
  rawset(list, rawlen(list) + 1, rec)
  h = h + 1
  rawset(held, h, rec)
  for i = 1, n, 4 do
    local id, _, _, result = select(i, ...)
    local r = {}
    r.role = 'tool'
    r.content = result
    r.tool_call_id = id
    rawset(list, rawlen(list) + 1, r)
    h = h + 1
    rawset(held, h, r)
  end
end
--]==]
local function loop_helpers() if not H.loop_helpers_loaded then H.load_loop_helpers() H.loop_helpers_loaded = true end return H end function H.list_shape(...) return loop_helpers().list_shape(...) end function H.list_read(...) return loop_helpers().list_read(...) end function H.append_round(...) return loop_helpers().append_round(...) end local tconcat = table.concat -- (a stand-in kept by a caller stays valid)
--[==[ deferred base: (concat) table.concat honouring __tostring (ch. 05), a second chunk of this name (vm/deferred.rs `Deferred`)
local H = ... local type, error, tostring, tconcat, metafield = H.type, H.error, H.tostring, H.raw_tconcat, H.metafield_lua local function concat(list, sep, i, j)
  sep = sep or ''
  i = i or 1
  j = j or #list
  local parts = {}
  for k = i, j do
    local v = list[k]
    local tv = type(v)
    if tv == 'string' or tv == 'number' then
      parts[#parts + 1] = v
    elseif v == nil then
      error("invalid value (nil) at index " .. k .. " in table for 'concat'", 2)
    else
      if metafield(v, '__tostring') then
        parts[#parts + 1] = tostring(v)
      else
        error("invalid value (" .. tv .. ") at index " .. k .. " in table for 'concat'", 2)
      end
    end
  end
  return tconcat(parts, sep)
end
H.install_lib(H.c_libs.table, 'concat', concat)
--]==]
-- The sandbox ---------------------------------------------------------------
local G = _G
-- What a fresh state of the VM's libraries has beyond the sandbox's globals (the
-- base library's loaders, printers and raw functions; `utf8` and `math` are opened
-- only when needed, vm/deferred.rs `open_library`), removed by name: walking `_G` was a tenth of the
-- prelude's run. A test (vm/mod.rs) holds this list to what such a state has.
G.collectgarbage, G.dofile, G.load, G.loadfile, G.print, G.warn = nil, nil, nil, nil, nil, nil
G.rawequal, G.rawget, G.rawlen, G.rawset = nil, nil, nil, nil
-- (`pairs`, `next`, `pcall`, `xpcall`, `setmetatable` and `getmetatable` are
-- built on first touch: vm/mod.rs takes them out of `_G` after this chunk.)
--
--
-- The sandbox's own: assert, error, ipairs, select, tonumber, tostring, type, _G,
-- _VERSION, string, table, math, and the six above, built on first touch (the
-- host's globals are built on first touch too, and installed later).
--
string.dump = nil
--[==[ deferred argv: the frozen `argv`, a second chunk of this name (vm/deferred.rs `Deferred`)
local H = ... local type, math_type, tostring, setmetatable, rawget, error = H.type, H.math_type, H.tostring, H.setmetatable, H.rawget, H.error
-- A frozen `argv` (outside the H1 body): empty stand-ins that forward reads to the data and refuse every write.
local function frozen_key(k)
  if type(k) == 'string' then return "'" .. k .. "'" end
  if math_type(k) == 'integer' then return 'Integer(' .. tostring(k) .. ')' end
  if type(k) == 'number' then return 'Number(' .. tostring(k) .. ')' end
  if type(k) == 'boolean' then return 'Boolean(' .. tostring(k) .. ')' end
  return type(k)
end
local function freeze(value)
  if type(value) ~= 'table' then return value end
  local data = value
  return setmetatable({}, {
    __index = function(_, k) return freeze(rawget(data, k)) end,
    __newindex = function(_, k)
      error(H.make_error('lua', 'argv is frozen outside H1: cannot set field ' .. frozen_key(k)))
    end,
    __metatable = 'argv is frozen',
  })
end
function H.freeze_argv(value)
  H.argv_frozen = true
  H.argv_value = freeze(value)
end
--]==]
-- getmetatable / setmetatable see guards through __metatable as usual.
H.rawget, H.rawset, H.rawequal, H.rawlen = rawget, rawset, rawequal, rawlen
H.next = next
--
H.setmetatable, H.getmetatable = setmetatable, getmetatable
H.select, H.type, H.tostring, H.error = select, type, tostring, error
H.tpack, H.tunpack = tpack, tunpack
H.raw_tconcat, H.tsort, H.collectgarbage, H.base_pcall, H.base_xpcall, H.globals_table, H.weak_keys = tconcat, tsort, collectgarbage, pcall, xpcall, GLOBALS, WEAK_KEYS

-- The engine's bookkeeping of error values (error.rs: `H.run_kinds`, `H.located`,
-- `H.born`), weakly keyed so values the prompt lets go are collected, is made
-- with the error values' part (above): the engine reads it only of values that
-- part made genuine.
--
H.suspends = 0
-- (`H.lazy_globals`, the globals built on first touch, all pending: vm/mod.rs, from pf-syntax's `LUA_GLOBALS`.)
return H
