-- KEYS and ARGV: app/store/script_interfaces.py CLEAR_UNLESS_CHANGED_SINCE. Removes the user
-- only when no change came after the read, so a newer change stays listed.
local score = redis.call('ZSCORE', K_changed_users, A_user_id)
if score and tonumber(score) <= tonumber(A_read_at) then
  return redis.call('ZREM', K_changed_users, A_user_id)
end
return 0
