-- Parks a refused or failed user until A_parked_until; a change newer than the build's read
-- stays listed (the same rule as clear_unless_changed_since).
local score = redis.call('ZSCORE', K_changed_users, A_user)
if score and tonumber(score) <= tonumber(A_read_at) then
  redis.call('ZREM', K_changed_users, A_user)
end
redis.call('ZADD', K_parked, A_parked_until, A_user)
return 1
