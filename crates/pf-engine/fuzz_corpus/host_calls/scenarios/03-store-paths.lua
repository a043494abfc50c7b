for _, p in ipairs({ '', '.', '..', '/', 'a\0b', '\xff', string.rep('d/', 300) .. 'f', 'nul', 'a:b', 'a\\b' }) do
  check(pcall(store.write, p, 'x'))
  check(pcall(store.read, p))
  check(pcall(store.read, p, 0/0, -1))
  check(pcall(store.str_replace, p, '', ''))
  check(pcall(store.glob, p))
  check(pcall(store.delete, p))
end
check(pcall(store.write, 'ok.txt', 'line\n'))
check(pcall(store.read, 'ok.txt', math.mininteger, math.maxinteger))
check(pcall(store.read_numbered, 'ok.txt', 1e308, -1e308))
check(pcall(store.str_replace, 'ok.txt', 'line', string.rep('x', 100000)))
