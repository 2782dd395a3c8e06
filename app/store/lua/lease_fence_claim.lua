-- A lease's fence on one user: the pass holding the token takes the user. Answers 1 when
-- taken, 0 while the user is being erased, -1 when a later holder of the lease (a higher
-- token) has taken them.
if redis.call('EXISTS', K_erasing) == 1 then return 0 end
local current = redis.call('GET', K_fence)
if current and tonumber(current) > tonumber(A_token) then return -1 end
redis.call('SET', K_fence, A_token, 'PX', A_ttl_ms)
return 1
