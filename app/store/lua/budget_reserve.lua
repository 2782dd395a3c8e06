-- Reserve one call and an estimate of tokens against the namespace's and the org's budgets,
-- both or neither.
-- Answers {1} when granted, or {0, 'namespace'|'org', 1 when this is the namespace's first
-- deferral in the window (else 0)}. Not a refusal word: a deferral is no error to a caller.
--#include budget_window
local now_ms, window_ms = tonumber(A_now_ms), tonumber(A_window_ms)
local ns, estimate = A_namespace, tonumber(A_estimated_tokens)
budget_trim(K_window, K_reservations, K_spent, now_ms, window_ms)

local spent = redis.call('HMGET', K_spent, 'calls', 'tokens', 'calls:' .. ns, 'tokens:' .. ns)
local ns_caps = redis.call('HMGET', K_namespace_limits, 'calls', 'tokens')
local org_caps = redis.call('HMGET', K_org_limits, 'calls', 'tokens')

local function over(cap, used, want)
  cap = budget_cap(cap)
  return cap ~= nil and budget_number(used) + want > cap
end

local scope = nil
if over(ns_caps[1], spent[3], 1) or over(ns_caps[2], spent[4], estimate) then
  scope = 'namespace'
elseif over(org_caps[1], spent[1], 1) or over(org_caps[2], spent[2], estimate) then
  scope = 'org'
end
if scope then
  local first = redis.call('SET', K_deferral_logged, '1', 'NX', 'PX', window_ms)
  return {0, scope, first and 1 or 0}
end

redis.call('ZADD', K_window, now_ms, A_reservation_id)
redis.call('HSET', K_reservations, A_reservation_id, estimate .. '\t0\t' .. ns)
budget_add(K_spent, ns, 1, estimate)
-- An org that stops calling leaves nothing behind once its window is over.
for _, key in ipairs({K_window, K_reservations, K_spent}) do
  redis.call('PEXPIRE', key, window_ms * 2)
end
return {1}
