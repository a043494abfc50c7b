-- Host functions whose argument conversion runs prompt code that calls the host.
local nasty = setmetatable({}, {
  __tostring = function() store.write('re.txt', 'x'); return 're' end,
  __index = function() log('inside'); return nil end,
  __pairs = function(t) models.infer('nested'); return next, {}, nil end,
  __len = function() tasks.pending(); return 1 end,
})
for _, f in ipairs({ store.write, log, untrusted, models.infer, tools.call, tools.add, tools.always,
                     messages.new, tasks.spawn, tasks.when_all, fanout, call, input.ask }) do
  check(pcall(f, nasty, nasty))
  check(pcall(f, 'x', nasty))
end
-- jump checks only that its target is a string at the call (any string is
-- recorded and looked up when the block ends, guide ch. 08), so only non-strings here.
check(pcall(jump, nasty))
check(pcall(jump, nil))
