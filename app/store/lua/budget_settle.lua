-- Settle a reservation with what the call really cost, or release it (the call was not made
-- or failed). A reservation settles once: a second settle or release changes nothing.
-- Answers 1 when the reservation was changed, else 0 (unknown, already settled, or expired).
--#include budget_window
local now_ms, window_ms = tonumber(A_now_ms), tonumber(A_window_ms)
budget_trim(K_window, K_reservations, K_spent, now_ms, window_ms)
local entry = redis.call('HGET', K_reservations, A_reservation_id)
if not entry then return 0 end
local reserved, settled, ns = budget_parse(entry)
if settled == '1' then return 0 end
if A_mode == 'release' then
  budget_add(K_spent, ns, -1, -reserved)
  redis.call('HDEL', K_reservations, A_reservation_id)
  redis.call('ZREM', K_window, A_reservation_id)
  return 1
end
local real = reserved
if A_real_tokens ~= '' then real = tonumber(A_real_tokens) end
budget_add(K_spent, ns, 0, real - reserved)
redis.call('HSET', K_reservations, A_reservation_id, real .. '\t1\t' .. ns)
return 1
