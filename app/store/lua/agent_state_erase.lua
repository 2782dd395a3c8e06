-- Erasure: every named state of one scope goes, whatever was written since it was listed, and
-- the audit entry that records it lands in the same step (when the call gives one).
local erased = 0
for i = 0, #ARGV - A_state_agents_from do
  erased = erased + redis.call('DEL', KEYS[K_states_from + i])
  redis.call('HDEL', K_scope_agents, ARGV[A_state_agents_from + i])
end
if A_audit_head ~= '' then
  redis.call('LPUSH', K_audit, A_audit_head .. erased .. A_audit_tail)
  redis.call('LTRIM', K_audit, 0, tonumber(A_audit_max) - 1)
end
return erased
