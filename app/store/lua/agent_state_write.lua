-- The compare-and-set write of one agent state (app/store/agent_state.py): the new hash
-- replaces the stored one only while the stored etag is the expected one.
if A_erasing_checked == '1' and redis.call('EXISTS', K_erasing) == 1 then return {'ERASING'} end
local current = redis.call('HGET', K_state, 'etag') or ''
if current ~= A_expected_etag then
  return {'CONFLICT', redis.call('HGETALL', K_state)}
end
redis.call('DEL', K_state)
redis.call('HSET', K_state, unpack(ARGV, A_fields_from))
redis.call('PEXPIREAT', K_state, A_expires_ms)
redis.call('HSET', K_scope_agents, A_agent, A_expires_ms)
-- The agents hash lives as long as the scope's latest state. Expiries stay decimal strings:
-- a Lua number of that size would be formatted as 1.8e+12.
local latest, latest_n = A_expires_ms, tonumber(A_expires_ms)
for _, at in ipairs(redis.call('HVALS', K_scope_agents)) do
  local n = tonumber(at)
  if n and n > latest_n then latest, latest_n = at, n end
end
redis.call('PEXPIREAT', K_scope_agents, latest)
return {'OK', redis.call('HGET', K_state, 'version')}
