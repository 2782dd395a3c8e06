-- Replace a budget's caps and answer the old ones, in one step (the audit entry's old values
-- are the caps this write replaced).
-- KEYS: limits. ARGV: calls cap ('' = none), tokens cap ('' = none), set_by, set_at (ns).
-- Answers {old calls cap, old tokens cap} (false = none).
local old = redis.call('HMGET', KEYS[1], 'calls', 'tokens')
redis.call('HSET', KEYS[1], 'set_by', ARGV[3], 'set_at', ARGV[4])
local names = {'calls', 'tokens'}
for i = 1, 2 do
  if ARGV[i] == '' then
    redis.call('HDEL', KEYS[1], names[i])
  else
    redis.call('HSET', KEYS[1], names[i], ARGV[i])
  end
end
return old
