-- KEYS: 1 sources, 2 digest, 3 source expiry. ARGV: 1 now. Sources whose valid_to passed
-- leave the digest (a fact that "passes its valid_to" changes it, with no write of its own).
--#include memory_digest
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
if #due == 0 then return 0 end
local d = redis.call('HMGET', KEYS[2], 'digest', 'count')
local digest = d[1] or ZERO
local count = tonumber(d[2] or '0')
for _, mid in ipairs(due) do
  local old = redis.call('HGET', KEYS[1], mid)
  if old then
    digest = xor_hex(digest, redis.sha1hex(mid .. '|' .. old))
    count = count - 1
    redis.call('HDEL', KEYS[1], mid)
  end
  redis.call('ZREM', KEYS[3], mid)
end
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
redis.call('HSET', KEYS[2], 'digest', digest, 'count', tostring(count), 'changed_at', ARGV[1],
  'removed_at', ARGV[1], 'next_expiry', first[2] or '')
return #due
