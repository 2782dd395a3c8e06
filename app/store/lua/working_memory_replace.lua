-- KEYS: scope, index, erasing marker. ARGV: block_key, now_ns, old, old length, new, new
-- length. Every occurrence is replaced, left to right without overlap, as str.replace does;
-- byte matching equals character matching for valid UTF-8.
--#include version
--#include working_memory_parse
if erasing() then return {'ERASING'} end
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return {'MISSING'} end
local v, limit, n, pos = parse(raw)
local content = string.sub(raw, pos)
local parts, count, init = {}, 0, 1
while true do
  local s, e = string.find(content, ARGV[3], init, true)
  if not s then break end
  parts[#parts + 1] = string.sub(content, init, s - 1)
  parts[#parts + 1] = ARGV[5]
  init = e + 1
  count = count + 1
end
if count == 0 then return {'ABSENT'} end
parts[#parts + 1] = string.sub(content, init)
local length = n - count * tonumber(ARGV[4]) + count * tonumber(ARGV[6])
if length > limit then return {'LIMIT', length, limit} end
return store(KEYS[1], KEYS[2], ARGV[1], next_version(v, ARGV[2]), limit, length,
  table.concat(parts))
