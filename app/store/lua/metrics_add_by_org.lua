-- KEYS: 1 metrics hash, 2 labelled orgs set. ARGV: 1 cap, 2 org, then (field_for_org,
-- field_for_other, amount) per counter. The org keeps its own label if it has one or there is
-- room for it; answers 1 when it did.
local own = redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 1
if not own and redis.call('SCARD', KEYS[2]) < tonumber(ARGV[1]) then
  redis.call('SADD', KEYS[2], ARGV[2])
  own = true
end
for i = 3, #ARGV, 3 do
  local field = own and ARGV[i] or ARGV[i + 1]
  redis.call('HINCRBY', KEYS[1], field, ARGV[i + 2])
end
return own and 1 or 0
