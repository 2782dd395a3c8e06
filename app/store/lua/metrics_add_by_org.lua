-- The org keeps its own label if it has one or there is room for it (fewer than A_cap orgs
-- labelled); answers 1 when it did.
local own = redis.call('SISMEMBER', K_orgs, A_org) == 1
if not own and redis.call('SCARD', K_orgs) < tonumber(A_cap) then
  redis.call('SADD', K_orgs, A_org)
  own = true
end
for i = A_counters_from, #ARGV, 3 do
  local field = own and ARGV[i] or ARGV[i + 1]
  redis.call('HINCRBY', K_metrics, field, ARGV[i + 2])
end
return own and 1 or 0
