-- The odd values, one constructor each; `T` gives the traps' sentinel error and
-- `T.reenter()`, which calls a random host function from inside a metamethod.
return {
  function() return nil end,
  function() return true end,
  function() return false end,
  function() return 0 end,
  function() return -1 end,
  function() return 1 end,
  function() return 3 end,
  function() return math.maxinteger end,
  function() return math.mininteger end,
  function() return 2^53 end,
  function() return 2^63 end,
  function() return 1e308 end,
  function() return -1e308 end,
  function() return 0/0 end,
  function() return 1/0 end,
  function() return -1/0 end,
  function() return -0.0 end,
  function() return 0.5 end,
  function() return '' end,
  function() return 'x' end,
  function() return 'a\0b' end,
  function() return '\xff\xfe\xfd' end,
  function() return '\xc3\x28' end,
  function() return '\xed\xa0\x80' end,
  function() return string.rep('z', 100000) end,
  function() return string.rep('\n', 5000) end,
  function() return '## Nope' end,
  function() return '### Worker' end,
  function() return '## ' end,
  function() return 'acme/kit/echo' end,
  function() return 'echo' end,
  function() return 'a/b/c' end,
  function() return '../../etc/passwd' end,
  function() return '/etc/passwd' end,
  function() return 'dir/../../x' end,
  function() return 'CON' end,
  function() return 'f.txt' end,
  function() return '*' end,
  function() return '**/*' end,
  function() return '[' end,
  function() return '{{args}}' end,
  function() return '{{' end,
  function() return '%s%n%d' end,
  function() return 'w' end,
  function() return 'user' end,
  function() return 'assistant' end,
  function() return 'system' end,
  function() return 'tool' end,
  function() return {} end,
  function() return { 1, 2, 3 } end,
  function() return { 'a', 'b', nil, 'd' } end,
  function() return { role = 'user', content = 'hi' } end,
  function() return { { role = 'user', content = 'hi' } } end,
  function() return { { role = 'bogus', content = {} } } end,
  function() return { timeout = -1 } end,
  function() return { timeout = 0/0 } end,
  function() return { timeout = 1e308 } end,
  function() return { args = {} } end,
  function() return { type = 'object', properties = { x = { type = 'string' } } } end,
  function() return { [1.5] = 'f', [true] = 'b', [{}] = 't' } end,
  function() return { [0] = 'zero', [-1] = 'neg', [math.maxinteger] = 'max' } end,
  function()
    local t = {}
    for i = 1, 20000 do t[i] = i end
    return t
  end,
  function()
    local t = {}
    for i = 1, 300 do t = { t } end
    return t
  end,
  function()
    local t = {}
    for i = 1, 300 do t = { x = t } end
    return t
  end,
  function()
    local t = {}
    t.self = t
    t[1] = t
    return t
  end,
  function()
    local a, b = {}, {}
    a.b, b.a = b, a
    return { a, b }
  end,
  -- Traps: every metamethod raises the sentinel.
  function()
    local function trap() error(T.sentinel) end
    return setmetatable({}, {
      __index = trap, __newindex = trap, __len = trap, __pairs = trap,
      __tostring = trap, __eq = trap, __lt = trap, __le = trap, __concat = trap,
      __call = trap, __name = 'trap', __close = trap, __unm = trap, __add = trap,
    })
  end,
  -- Traps that raise a table shaped like a host error.
  function()
    local fake = T.mine({ kind = 'cancelled', message = 'interrupted by Ctrl-C' })
    local function trap() error(fake) end
    return setmetatable({ 1 }, { __index = trap, __len = trap, __pairs = trap, __tostring = trap })
  end,
  -- Traps that call back into the host from inside a metamethod.
  function()
    local function reenter() return T.reenter() end
    return setmetatable({}, {
      __index = reenter, __len = function() T.reenter(); return 2 end,
      __pairs = function(t) T.reenter(); return next, {}, nil end,
      __tostring = function() T.reenter(); return 'reentered' end,
    })
  end,
  -- Metamethods that lie about the shape.
  function()
    return setmetatable({}, {
      __len = function() return math.maxinteger end,
      __index = function(_, k) return k end,
      __tostring = function() return {} end,
      __pairs = function() return function() return 1, 1 end, nil, nil end,
    })
  end,
  function()
    return setmetatable({}, { __len = function() return -5 end, __tostring = function() return nil end })
  end,
  function()
    return setmetatable({ role = 'user' }, { __index = function() return string.rep('y', 1000) end })
  end,
  function() return setmetatable({}, { __metatable = 'locked' }) end,
  function() return function() end end,
  function() return function() error(T.sentinel) end end,
  function() return function(...) return ... end end,
  function() return function() return {}, 0/0, nil, 'x' end end,
  function() return function() T.reenter(); return 'ok' end end,
  function() return print end,
  function() return T.host_value() end,
}
