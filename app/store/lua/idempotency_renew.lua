-- KEYS: 1 the key's record. ARGV: 1 the holder, 2 the lease's new end (ms). Extends the lease
-- of a running try that still holds the key; answers 1 then, else 0.
local held = redis.call('HMGET', KEYS[1], 'holder', 'state')
if held[1] ~= ARGV[1] or held[2] ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', ARGV[2])
return 1
