-- The one-script form (Redis 6, and `quota-worker keys --script` for other
-- programs): EVALSHA runs the whole text on every call, which ends here by
-- running the operation ARGV[1] names on the call's KEYS and ARGV.

local op = Ops[ARGV[1]]
if not op then
  bind()
  return fail('unknown op ' .. tostring(ARGV[1]))
end
return op(KEYS, ARGV)
