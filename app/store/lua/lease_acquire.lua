-- Takes the lease when free: its value is holder|token, the token the next of its generation.
if redis.call('EXISTS', K_lease) == 1 then return false end
local token = redis.call('INCR', K_generation)
redis.call('SET', K_lease, A_holder .. '|' .. token, 'PX', A_ttl_ms)
redis.call('HSET', K_acquired, 'token', token, 'at', A_now_s)
return token
