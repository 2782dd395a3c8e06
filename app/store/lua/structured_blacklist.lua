-- Answers {'OK', changed (0|1), since (ns, '' when not blacklisted)}. A change and its audit
-- entry commit together, so the audit list holds exactly the changes, in their order.
-- Lifting it lists the user again with no date of its own (score 0, unless a change already
-- listed it): the scan dates it by the user's digest, so a build refused under the blacklist
-- is tried at the next scan if the sources moved since the build, with no new cooldown.
local since = redis.call('ZSCORE', K_blacklist, A_user)
if A_on == '1' then
  if since then return {'OK', 0, since} end
  redis.call('ZADD', K_blacklist, A_now, A_user)
  since = A_now
else
  if not since then return {'OK', 0, ''} end
  redis.call('ZREM', K_blacklist, A_user)
  redis.call('ZREM', K_parked, A_user)
  redis.call('ZADD', K_changed_users, 'NX', 0, A_user)
  since = ''
end
redis.call('LPUSH', K_audit, A_audit_entry)
redis.call('LTRIM', K_audit, 0, tonumber(A_audit_max) - 1)
return {'OK', 1, since}
