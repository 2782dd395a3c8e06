-- KEYS: 1 a lock or lease. ARGV: 1 the holder's value, 2 ttl ms. Only the holder extends it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
