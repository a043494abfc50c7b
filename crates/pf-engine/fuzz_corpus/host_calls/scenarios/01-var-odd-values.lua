-- var holds JSON: odd values must be refused as lua errors, never crash.
for _, v in ipairs({ 0/0, 1/0, -1/0, function() end, setmetatable({}, { __pairs = function() error('trap') end }) }) do
  local ok, err = pcall(function() var.x = v end)
  check(ok, err, 'var.x = odd')
end
local cyclic = {}
cyclic.me = cyclic
check(pcall(function() var.c = cyclic end))
local deep = {}
for i = 1, 500 do deep = { deep } end
check(pcall(function() var.d = deep end))
check(pcall(function() return var.missing end))
check(pcall(function() var[0/0] = 1 end))
check(pcall(function() var[{}] = 1 end))
check(pcall(function() var['\0'] = '\xff' end))
