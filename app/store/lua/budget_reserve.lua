-- Reserve one call and an estimate of tokens against the namespace's and the org's budgets,
-- both or neither.
-- KEYS: org limits, namespace limits, window, reservations, spent, deferral-logged marker.
-- ARGV: now ms, window ms, reservation id, namespace, estimated tokens.
-- Answers {1} when granted, or {0, 'namespace'|'org', 1 when this is the namespace's first
-- deferral in the window (else 0)}. Not a refusal word: a deferral is no error to a caller.
--#include budget_window
local now_ms, window_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local ns, estimate = ARGV[4], tonumber(ARGV[5])
budget_trim(KEYS[3], KEYS[4], KEYS[5], now_ms, window_ms)

local spent = redis.call('HMGET', KEYS[5], 'calls', 'tokens', 'calls:' .. ns, 'tokens:' .. ns)
local ns_caps = redis.call('HMGET', KEYS[2], 'calls', 'tokens')
local org_caps = redis.call('HMGET', KEYS[1], 'calls', 'tokens')

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
  local first = redis.call('SET', KEYS[6], '1', 'NX', 'PX', window_ms)
  return {0, scope, first and 1 or 0}
end

redis.call('ZADD', KEYS[3], now_ms, ARGV[3])
redis.call('HSET', KEYS[4], ARGV[3], estimate .. '\t0\t' .. ns)
budget_add(KEYS[5], ns, 1, estimate)
-- An org that stops calling leaves nothing behind once its window is over.
for i = 3, 5 do redis.call('PEXPIRE', KEYS[i], window_ms * 2) end
return {1}
