-- What the rolling window holds for the org and one namespace (trimmed first), and the caps.
-- KEYS: window, reservations, spent, limits (the org's or the namespace's).
-- ARGV: now ms, window ms, namespace ('' for the org's own sums).
-- Answers {calls spent, tokens spent, calls cap, tokens cap, set_by, set_at}.
--#include budget_window
budget_trim(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), tonumber(ARGV[2]))
local suffix = ARGV[3] == '' and '' or (':' .. ARGV[3])
local spent = redis.call('HMGET', KEYS[3], 'calls' .. suffix, 'tokens' .. suffix)
local caps = redis.call('HMGET', KEYS[4], 'calls', 'tokens', 'set_by', 'set_at')
return {budget_number(spent[1]), budget_number(spent[2]), caps[1], caps[2], caps[3], caps[4]}
