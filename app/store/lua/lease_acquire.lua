-- KEYS: lease, generation counter, acquired-at. ARGV: holder, ttl ms, now (seconds).
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
redis.call('HSET', KEYS[3], 'token', token, 'at', ARGV[3])
return token
