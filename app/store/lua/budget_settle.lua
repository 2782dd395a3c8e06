-- Settle a reservation with what the call really cost, or release it (the call was not made
-- or failed). A reservation settles once: a second settle or release changes nothing.
-- KEYS: window, reservations, spent. ARGV: now ms, window ms, reservation id, 'settle' or
-- 'release', real tokens ('' = unknown: the estimate stands).
-- Answers 1 when the reservation was changed, else 0 (unknown, already settled, or expired).
--#include budget_window
local now_ms, window_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
budget_trim(KEYS[1], KEYS[2], KEYS[3], now_ms, window_ms)
local entry = redis.call('HGET', KEYS[2], ARGV[3])
if not entry then return 0 end
local reserved, settled, ns = budget_parse(entry)
if settled == '1' then return 0 end
if ARGV[4] == 'release' then
  budget_add(KEYS[3], ns, -1, -reserved)
  redis.call('HDEL', KEYS[2], ARGV[3])
  redis.call('ZREM', KEYS[1], ARGV[3])
  return 1
end
local real = reserved
if ARGV[5] ~= '' then real = tonumber(ARGV[5]) end
budget_add(KEYS[3], ns, 0, real - reserved)
redis.call('HSET', KEYS[2], ARGV[3], real .. '\t1\t' .. ns)
return 1
