-- A lock or lease: only its holder releases it.
if redis.call('GET', K_lock) ~= A_holder then return 0 end
return redis.call('DEL', K_lock)
