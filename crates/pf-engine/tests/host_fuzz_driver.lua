-- The host-call fuzz driver (tests/host_fuzz.rs): `args` is "SEED CALLS".
-- It calls every host function the sandbox exposes with odd arguments and
-- checks what comes back; it returns `fuzz ok ...` or the failures it found.
local seed_text, calls_text = string.match(args, '^(%d+) (%d+)$')
local state = math.tointeger(tonumber(seed_text)) or 1
local calls = math.tointeger(tonumber(calls_text)) or 100

-- A 64-bit LCG: the driver's own, so a seed replays exactly.
local function rand(n)
  state = state * 6364136223846793005 + 1442695040888963407
  return ((state >> 33) % n) + 1
end

local KINDS = {
  lua = true, internal = true, tool = true, unbound_tool = true,
  out_of_scope_tool = true, task_not_owned = true, task_consumed = true,
  tasks_live = true, context_exhausted = true, empty_model_reply = true,
  tool_loop_exhausted = true,
}
local failures, errors, done, memory_errors = {}, 0, 0, 0
-- True while the call being checked is one of Lua's own (below).
local plain_ok = false
local mine = setmetatable({}, { __mode = 'k' })
local host_values = {}
local spawned = {}
local what_now = '?'

T = { sentinel = {} }
mine[T.sentinel] = true
-- A table the prompt made, raised through a host call, is its own value.
function T.mine(v) mine[v] = true; return v end

-- A field read that a trap metatable cannot break (the sandbox has no rawget).
local function field(v, k)
  local ok, r = pcall(function() return v[k] end)
  if ok then return r end
  return nil
end

local function describe(v)
  local t = type(v)
  if t == 'string' then
    return string.format('%q', #v > 160 and (string.sub(v, 1, 160) .. '...') or v)
  elseif t == 'table' and field(v, 'kind') ~= nil then
    return 'error{' .. tostring(field(v, 'kind')) .. ', ' .. describe(field(v, 'message')) .. '}'
  elseif t == 'number' or t == 'boolean' or t == 'nil' then
    return tostring(v)
  end
  return t
end

-- An error from a host call must be an error value with one of the error kinds
-- a prompt can meet (never `cancelled`: nothing cancels this run), or the
-- prompt's own value passed through unchanged.
function check(ok, err, what)
  done = done + 1
  if ok then return end
  errors = errors + 1
  if err == 'not enough memory' or field(err, 'message') == 'not enough memory' then memory_errors = memory_errors + 1 end
  if type(err) == 'table' and mine[err] then return end
  if type(err) == 'string' and plain_ok then return end
  -- A suspending host call reached from a metamethod that Lua runs inside C
  -- (tostring, table.sort...) cannot suspend: Lua's own runtime error, kind `lua`.
  if err == 'attempt to yield across a C-call boundary' then return end
  if type(err) == 'table' then
    local kind, message = field(err, 'kind'), field(err, 'message')
    if KINDS[kind] and type(message) == 'string' then return end
    if kind == 'cancelled' and type(message) == 'string' and field(err, 'task') ~= nil then return end
  end
  if #failures < 20 then
    failures[#failures + 1] = (what or what_now) .. ' raised ' .. describe(err)
  end
end

-- Every host function reachable from the globals (the Lua standard library's
-- own functions apart, which raise plain strings by design).
local LUA_OWN = { math = true, string = true, table = true, utf8 = true, T = true, _G = true }
-- Not fuzzed: `jump` records any string target, looked up when the block
-- ends (guide ch. 08), so it would end the driver's block; the rest are Lua's
-- own and the driver's.
local SKIP = {
  error = true, assert = true, jump = true, select = true, type = true,
  tonumber = true, check = true, print = true,
}
-- The sandbox's versions of Lua's own functions raise Lua's own plain-string
-- argument errors, as the standard library does; host functions raise error values.
local PLAIN_ERRORS = {
  pairs = true, ipairs = true, next = true, tostring = true, setmetatable = true,
  getmetatable = true, pcall = true, xpcall = true,
}
local targets = {}
do
  local names = {}
  for k in pairs(_G) do names[#names + 1] = k end
  for _, k in ipairs(names) do
    local v = _G[k]
    if type(v) == 'function' and not SKIP[k] then
      targets[#targets + 1] = { name = k, f = v }
    elseif type(v) == 'table' and not LUA_OWN[k] then
      local inner = {}
      for ik, iv in pairs(v) do
        if type(iv) == 'function' then inner[#inner + 1] = ik end
      end
      table.sort(inner)
      for _, ik in ipairs(inner) do targets[#targets + 1] = { name = k .. '.' .. ik, f = v[ik] } end
    end
  end
end

local VALUES = dofile_values()

local function value()
  local v = VALUES[rand(#VALUES)]()
  if type(v) == 'table' then mine[v] = true end
  return v
end

function T.host_value()
  if #host_values == 0 then return nil end
  return host_values[rand(#host_values)]
end

-- Keep what a call returned: handles to call methods on and pass back, and
-- every task handle, so the section can deliver its tasks before it ends.
local function keep(results)
  for i = 2, math.min(results.n or #results, 4) do
    local v = results[i]
    if type(v) == 'table' and not mine[v] then
      if field(v, 'task') ~= nil then spawned[#spawned + 1] = v end
      if #host_values < 64 then host_values[#host_values + 1] = v end
    end
  end
end

local depth = 0
function T.reenter()
  if depth >= 2 then return nil end
  depth = depth + 1
  local target = targets[rand(#targets)]
  local results = table.pack(pcall(target.f, value(), value()))
  local ok, err = results[1], results[2]
  if ok then keep(results) end
  depth = depth - 1
  local outer = plain_ok
  plain_ok = PLAIN_ERRORS[target.name] or false
  check(ok, err, 'reentered ' .. target.name)
  plain_ok = outer
  return 'reentered'
end


-- A handle's methods too (message lists, model handles, tool results).
local function method_of(v)
  local names = {}
  local ok = pcall(function()
    for k, f in pairs(v) do
      if type(f) == 'function' and type(k) == 'string' and string.sub(k, 1, 2) ~= '__' then names[#names + 1] = k end
    end
  end)
  local mt = getmetatable(v)
  local index = type(mt) == 'table' and field(mt, '__index')
  if type(index) == 'table' then
    for k, f in pairs(index) do
      if type(f) == 'function' and type(k) == 'string' and string.sub(k, 1, 2) ~= '__' then names[#names + 1] = k end
    end
  end
  if not ok or #names == 0 then return nil end
  table.sort(names, function(a, b) return tostring(a) < tostring(b) end)
  local name = names[rand(#names)]
  return name, v[name]
end

SCENARIOS()

for i = 1, calls do
  local name, f
  if #host_values > 0 and rand(4) == 1 then
    local v = host_values[rand(#host_values)]
    local mname, mf = method_of(v)
    if mf then
      name, f = 'handle:' .. tostring(mname), function(...) return mf(v, ...) end
    end
  end
  if not f then
    local target = targets[rand(#targets)]
    name, f = target.name, target.f
  end
  local argc = rand(5) - 1
  local argv = {}
  for a = 1, argc do argv[a] = value() end
  -- A fanout over a large collection would start an arm per member.
  if name == 'fanout' and type(argv[2]) == 'table' then
    local ok, n = pcall(function() return #argv[2] end)
    if not ok or type(n) ~= 'number' or n > 16 then argv[2] = { 1, 2 } end
  end
  what_now = name .. '(' .. (function()
    local parts = {}
    for a = 1, argc do parts[a] = describe(argv[a]) end
    return table.concat(parts, ', ')
  end)() .. ')'
  local results = table.pack(pcall(f, table.unpack(argv, 1, argc)))
  plain_ok = PLAIN_ERRORS[name] or false
  check(results[1], results[2])
  plain_ok = false
  if results[1] then keep(results) end
end

-- Deliver every task still live, so the section can end.
for _, t in ipairs(spawned) do
  local ok, err = pcall(tasks.when_all, { t })
  if not ok and not (type(err) == 'table' and (err.kind == 'task_consumed' or err.kind == 'task_not_owned')) then
    check(ok, err, 'delivering a task')
  end
end
for _, t in ipairs(tasks.pending()) do pcall(tasks.cancel, t) end
for _, t in ipairs(spawned) do pcall(tasks.when_all, { t }) end

if #failures > 0 then
  return 'FAIL seed ' .. seed_text .. ':\n' .. table.concat(failures, '\n')
end
local names = {}
for _, t in ipairs(targets) do names[#names + 1] = t.name end
return 'fuzz ok: ' .. done .. ' calls, ' .. errors .. ' errors (' .. memory_errors .. ' out of memory), ' .. #host_values .. ' handles kept; targets: ' .. table.concat(names, ' ')
