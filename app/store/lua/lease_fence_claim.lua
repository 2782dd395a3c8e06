-- KEYS: 1 a lease's fence on one user, 2 the user's erasure marker. ARGV: 1 token, 2 ttl ms.
-- The pass holding ``token`` takes the user. Answers 1 when taken, 0 while the user is being
-- erased, -1 when a later holder of the lease (a higher token) has taken them.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local current = redis.call('GET', KEYS[1])
if current and tonumber(current) > tonumber(ARGV[1]) then return -1 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
