-- What the rolling window holds for the org and one namespace (trimmed first), and the caps.
-- limits: the org's or the namespace's.
-- Answers {calls spent, tokens spent, calls cap, tokens cap, set_by, set_at}.
--#include budget_window
budget_trim(K_window, K_reservations, K_spent, tonumber(A_now_ms), tonumber(A_window_ms))
local suffix = A_namespace == '' and '' or (':' .. A_namespace)
local spent = redis.call('HMGET', K_spent, 'calls' .. suffix, 'tokens' .. suffix)
local caps = redis.call('HMGET', K_limits, 'calls', 'tokens', 'set_by', 'set_at')
return {budget_number(spent[1]), budget_number(spent[2]), caps[1], caps[2], caps[3], caps[4]}
