-- The sweep's delete: only the state it judged expired, never one rewritten since.
local current = redis.call('HGET', K_state, 'etag') or ''
if current ~= A_expected_etag then return 0 end
redis.call('DEL', K_state)
redis.call('HDEL', K_scope_agents, A_agent)
return 1
