-- KEYS: 1 the namespace's blacklisted users, 2 its audit list, 3 its parked users, 4 its
-- changed-users index. ARGV: 1 user, 2 '1' blacklist | '0' lift it, 3 now (ns), 4 the audit
-- entry (JSON), 5 how many audit entries the list keeps.
-- Answers {'OK', changed (0|1), since (ns, '' when not blacklisted)}. A change and its audit
-- entry commit together, so the audit list holds exactly the changes, in their order.
-- Lifting it lists the user again with no date of its own (score 0, unless a change already
-- listed it): the scan dates it by the user's digest, so a build refused under the blacklist
-- is tried at the next scan if the sources moved since the build, with no new cooldown.
local since = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ARGV[2] == '1' then
  if since then return {'OK', 0, since} end
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  since = ARGV[3]
else
  if not since then return {'OK', 0, ''} end
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZADD', KEYS[4], 'NX', 0, ARGV[1])
  since = ''
end
redis.call('LPUSH', KEYS[2], ARGV[4])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
return {'OK', 1, since}
