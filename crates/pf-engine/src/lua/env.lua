-- Installs the `prose` global and keeps it working under a user metatable on _G.
local H = ...
local rawget, rawset, rawequal, type, next, error = H.rawget, H.rawset, H.rawequal, H.type, next, error
local base_setmetatable, base_getmetatable = H.setmetatable, H.getmetatable
local G = _G

local PROSE_RO = 'prose is read-only: assign to `var` or a section global instead'

local function build(user_mt)
  local combined = {}
  if user_mt then for k, v in next, user_mt do combined[k] = v end end
  local uindex = user_mt and rawget(user_mt, '__index')
  local unewindex = user_mt and rawget(user_mt, '__newindex')
  combined.__index = function(t, k)
    if k == 'prose' then return H.prose_read() end
    if uindex == nil then return nil end
    if type(uindex) == 'function' then return uindex(t, k) end
    return uindex[k]
  end
  combined.__newindex = function(t, k, v)
    if k == 'prose' then error(PROSE_RO, 2) end
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
