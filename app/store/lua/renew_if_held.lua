-- A lock or lease: only its holder extends it.
if redis.call('GET', K_lock) ~= A_holder then return 0 end
redis.call('PEXPIRE', K_lock, A_ttl_ms)
return 1
