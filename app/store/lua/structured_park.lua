-- KEYS: 1 the changed-users index, 2 the parked users. ARGV: 1 user, 2 until (ns), 3 read-at (ns).
-- Parks a refused or failed user until ARGV[2]; a change newer than the build's read stays
-- listed (the same rule as clear_unless_changed_since).
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[3]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
