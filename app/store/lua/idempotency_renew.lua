-- Extends the lease of a running try that still holds the key; answers 1 then, else 0.
local held = redis.call('HMGET', K_record, 'holder', 'state')
if held[1] ~= A_holder or held[2] ~= 'running' then return 0 end
redis.call('HSET', K_record, 'lease_until', A_lease_until_ms)
return 1
