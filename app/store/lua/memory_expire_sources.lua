-- KEYS and ARGV: app/store/script_interfaces.py MEMORY_EXPIRE_SOURCES. Sources whose valid_to
-- passed leave the digest (a fact that "passes its valid_to" changes it, with no write of its
-- own).
--#include memory_digest
local due = redis.call('ZRANGEBYSCORE', K_source_expiry, '-inf', A_now)
if #due == 0 then return 0 end
local d = redis.call('HMGET', K_digest, 'digest', 'count')
local digest = d[1] or ZERO
local count = tonumber(d[2] or '0')
for _, mid in ipairs(due) do
  local old = redis.call('HGET', K_sources, mid)
  if old then
    digest = xor_hex(digest, redis.sha1hex(mid .. '|' .. old))
    count = count - 1
    redis.call('HDEL', K_sources, mid)
  end
  redis.call('ZREM', K_source_expiry, mid)
end
local first = redis.call('ZRANGE', K_source_expiry, 0, 0, 'WITHSCORES')
redis.call('HSET', K_digest, 'digest', digest, 'count', tostring(count), 'changed_at', A_now,
  'removed_at', A_now, 'next_expiry', first[2] or '')
return #due
