-- KEYS: 1 a lock or lease. ARGV: 1 the holder's value. Only the holder releases it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
