-- KEYS: scope, index, erasing marker. ARGV: block_key, now_ns, char_limit ('' keeps the
-- block's), content, content length, default char_limit.
--#include version
--#include working_memory_parse
if erasing() then return {'ERASING'} end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local last, limit = nil, tonumber(ARGV[3])
if raw then
  local v, l = parse(raw)
  last = v
  if not limit then limit = l end
end
if not limit then limit = tonumber(ARGV[6]) end
local length = tonumber(ARGV[5])
if length > limit then return {'LIMIT', length, limit} end
return store(KEYS[1], KEYS[2], ARGV[1], next_version(last, ARGV[2]), limit, length, ARGV[4])
