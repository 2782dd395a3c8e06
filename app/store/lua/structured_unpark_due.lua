-- A user whose wait is over is listed at score 0, not now: the scan dates the change by the
-- user's digest, so the retry starts no new cooldown (a refusal is tried again when
-- REFUSAL_RETRY_SECONDS pass, not a cooldown after that).
local due = redis.call('ZRANGEBYSCORE', K_parked, '-inf', A_now)
for _, user in ipairs(due) do
  redis.call('ZADD', K_changed_users, 'NX', 0, user)
  redis.call('ZREM', K_parked, user)
end
return #due
