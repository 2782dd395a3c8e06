-- KEYS: 1 the parked users, 2 the changed-users index. ARGV: 1 now (ns).
-- A user whose wait is over is listed at score 0, not now: the scan dates the change by the
-- user's digest, so the retry starts no new cooldown (a refusal is tried again when
-- REFUSAL_RETRY_SECONDS pass, not a cooldown after that).
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, user in ipairs(due) do
  redis.call('ZADD', KEYS[2], 'NX', 0, user)
  redis.call('ZREM', KEYS[1], user)
end
return #due
