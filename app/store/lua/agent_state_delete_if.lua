-- KEYS: state, scope's agents hash. ARGV: expected etag, agent. The sweep's delete: only the
-- state it judged expired, never one rewritten since.
local current = redis.call('HGET', KEYS[1], 'etag') or ''
if current ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[2], ARGV[2])
return 1
