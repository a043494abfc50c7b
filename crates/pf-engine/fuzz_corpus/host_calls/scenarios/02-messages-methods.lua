-- A message list's methods with odd arguments.
local ok, m = pcall(messages.new)
check(ok, m, 'messages.new')
if ok and type(m) == 'table' then
  for _, name in ipairs({ 'user', 'system', 'assistant', 'tool', 'add', 'clone', 'last' }) do
    local f = m[name]
    if type(f) == 'function' then
      for _, v in ipairs({ nil, 0/0, '\0', {}, m, function() end }) do
        check(pcall(f, m, v))
        check(pcall(f, v))
      end
    end
  end
end
