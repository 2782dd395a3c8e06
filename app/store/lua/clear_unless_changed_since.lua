-- KEYS: 1 a sorted set of users scored by change time. ARGV: 1 user, 2 read-at score.
-- Removes the user only when no change came after the read, so a newer change stays listed.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
