-- KEYS: scope, index, erasing marker. ARGV: block_key, now_ns, addition, addition length,
-- separator, separator length, default cap.
--#include version
--#include working_memory_parse
if erasing() then return {'ERASING'} end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local last, limit, length, content
if raw then
  local v, l, n, pos = parse(raw)
  last, limit = v, l
  length = n + tonumber(ARGV[6]) + tonumber(ARGV[4])
  if length > limit then return {'LIMIT', length, limit} end
  content = string.sub(raw, pos) .. ARGV[5] .. ARGV[3]
else
  limit = tonumber(ARGV[7])
  length = tonumber(ARGV[4])
  if length > limit then return {'LIMIT', length, limit} end
  content = ARGV[3]
end
return store(KEYS[1], KEYS[2], ARGV[1], next_version(last, ARGV[2]), limit, length, content)
