-- The compare-and-set write of one agent state (app/store/agent_state.py).
-- KEYS: state, scope's agents hash, and for a subject scope the subject's erasure marker.
-- ARGV: expected etag ('' = nothing stored), expiry ms (a decimal string), agent, then the
-- hash's field/value pairs.
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then return {'ERASING'} end
local current = redis.call('HGET', KEYS[1], 'etag') or ''
if current ~= ARGV[1] then
  return {'CONFLICT', redis.call('HGETALL', KEYS[1])}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[2])
-- The agents hash lives as long as the scope's latest state. Expiries stay decimal strings:
-- a Lua number of that size would be formatted as 1.8e+12.
local latest, latest_n = ARGV[2], tonumber(ARGV[2])
for _, at in ipairs(redis.call('HVALS', KEYS[2])) do
  local n = tonumber(at)
  if n and n > latest_n then latest, latest_n = at, n end
end
redis.call('PEXPIREAT', KEYS[2], latest)
return {'OK', redis.call('HGET', KEYS[1], 'version')}
