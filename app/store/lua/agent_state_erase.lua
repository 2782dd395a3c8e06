-- KEYS: the scope's agents hash, then state keys of that scope. ARGV: the agent of each state.
-- Erasure: every named state goes, whatever was written since it was listed.
local erased = 0
for i = 2, #KEYS do
  erased = erased + redis.call('DEL', KEYS[i])
  redis.call('HDEL', KEYS[1], ARGV[i - 1])
end
return erased
