-- Installs the `prose` global and keeps it working under a user metatable on _G.
local H = ...
local rawget, rawset, rawequal, type, next, error = H.rawget, H.rawset, H.rawequal, H.type, next, error
local base_setmetatable, base_getmetatable = H.setmetatable, H.getmetatable
local G = _G

local PROSE_RO = 'prose is read-only: assign to `var` or a section global instead'
local ARGV_FROZEN = 'argv is frozen outside H1: assign it in H1 only'

local function build(user_mt)
  local combined = {}
  if user_mt then for k, v in next, user_mt do combined[k] = v end end
  local uindex = user_mt and rawget(user_mt, '__index')
  local unewindex = user_mt and rawget(user_mt, '__newindex')
  combined.__index = function(t, k)
    if k == 'prose' then return H.prose_read() end
    if k == 'argv' and H.argv_frozen then return H.argv_value end
    if uindex == nil then return nil end
    if type(uindex) == 'function' then return uindex(t, k) end
    return uindex[k]
  end
  combined.__newindex = function(t, k, v)
    if k == 'prose' then error(H.make_error('lua', PROSE_RO)) end
    if k == 'argv' and H.argv_frozen then error(H.make_error('lua', ARGV_FROZEN)) end
    if unewindex == nil then return rawset(t, k, v) end
    if type(unewindex) == 'function' then return unewindex(t, k, v) end
    unewindex[k] = v
  end
  return combined
end

base_setmetatable(G, build(nil))

function G.setmetatable(t, mt)
  if rawequal(t, G) then
    base_setmetatable(G, build(mt))
    return t
  end
  return base_setmetatable(t, mt)
end

-- The sandbox has no coroutine library, whatever the runtime loaded for itself.
if rawget(G, 'coroutine') ~= nil then rawset(G, 'coroutine', nil) end

-- The shared library's top-level code runs directly, not as a block: the calls that
-- wait on the host (other than the store's) refuse while it loads.
local function refuse_while_loading(f)
  return function(...)
    if H.loading_shared then error('attempt to yield from outside a coroutine', 2) end
    return f(...)
  end
end
local function guard(t, name)
  if type(t) == 'table' and type(rawget(t, name)) == 'function' then
    rawset(t, name, refuse_while_loading(rawget(t, name)))
  end
end
guard(rawget(G, 'models'), 'infer')
guard(rawget(G, 'models'), 'loop')
guard(rawget(G, 'tools'), 'call')
guard(rawget(G, 'input'), 'ask')
guard(G, 'call')
guard(G, 'fanout')
local tasks = rawget(G, 'tasks')
if type(tasks) == 'table' then
  local names = {}
  for k in next, tasks do names[#names + 1] = k end
  for i = 1, #names do guard(tasks, names[i]) end
end
