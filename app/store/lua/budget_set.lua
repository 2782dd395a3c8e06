-- Replace a budget's caps and answer the old ones, in one step with the audit entry that
-- records the change (its old values are the caps this write replaced).
-- Answers {old calls cap, old tokens cap} (false = none).
local old = redis.call('HMGET', K_limits, 'calls', 'tokens')
redis.call('HSET', K_limits, 'set_by', A_set_by, 'set_at', A_set_at)
local names, caps = {'calls', 'tokens'}, {A_calls, A_tokens}
for i = 1, 2 do
  if caps[i] == '' then
    redis.call('HDEL', K_limits, names[i])
  else
    redis.call('HSET', K_limits, names[i], caps[i])
  end
end
if A_audit_head ~= '' then
  -- A cap as the entry's JSON: its decimal text (at most 2^53 - 1), or null for none.
  local function cap_json(raw)
    if raw == false or raw == '' then return 'null' end
    return raw
  end
  redis.call('LPUSH', K_audit,
             A_audit_head .. cap_json(old[1]) .. A_audit_middle .. cap_json(old[2]) .. A_audit_tail)
  redis.call('LTRIM', K_audit, 0, tonumber(A_audit_max) - 1)
end
return old
