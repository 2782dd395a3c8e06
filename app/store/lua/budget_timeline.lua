-- The rolling window's calls and tokens over time, for the org or one namespace: the window
-- cut into equal buckets, oldest first. A read: entries older than the window are skipped, not
-- trimmed (the next reserve or read takes them out of the sums).
-- Answers {calls, tokens, calls, tokens, ...}, two numbers per bucket.
--#include budget_window
local now_ms, window_ms = tonumber(A_now_ms), tonumber(A_window_ms)
local ns, count = A_namespace, tonumber(A_buckets)
local start = now_ms - window_ms
local sums = {}
for i = 1, count * 2 do sums[i] = 0 end
local entries = redis.call('ZRANGEBYSCORE', K_window, '(' .. start, '+inf', 'WITHSCORES')
for i = 1, #entries, 2 do
  local entry = redis.call('HGET', K_reservations, entries[i])
  if entry then
    local tokens, _, entry_ns = budget_parse(entry)
    if ns == '' or entry_ns == ns then
      local bucket = math.floor((tonumber(entries[i + 1]) - start) * count / window_ms)
      if bucket >= count then bucket = count - 1 end
      if bucket < 0 then bucket = 0 end
      sums[bucket * 2 + 1] = sums[bucket * 2 + 1] + 1
      sums[bucket * 2 + 2] = sums[bucket * 2 + 2] + tokens
    end
  end
end
return sums
