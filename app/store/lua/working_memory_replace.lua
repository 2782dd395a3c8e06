-- KEYS and ARGV: app/store/script_interfaces.py WORKING_MEMORY_REPLACE. Every occurrence is replaced, left to right without overlap, as str.replace does;
-- byte matching equals character matching for valid UTF-8.
--#include version
--#include working_memory_parse
if erasing() then return {'ERASING'} end
local raw = redis.call('HGET', K_scope, A_block_key)
if not raw then return {'MISSING'} end
local v, limit, n, pos = parse(raw)
local content = string.sub(raw, pos)
local parts, count, init = {}, 0, 1
while true do
  local s, e = string.find(content, A_old, init, true)
  if not s then break end
  parts[#parts + 1] = string.sub(content, init, s - 1)
  parts[#parts + 1] = A_new
  init = e + 1
  count = count + 1
end
if count == 0 then return {'ABSENT'} end
parts[#parts + 1] = string.sub(content, init)
local length = n - count * tonumber(A_old_length) + count * tonumber(A_new_length)
if length > limit then return {'LIMIT', length, limit} end
return store(K_scope, K_index, A_block_key, next_version(v, A_now), limit, length,
  table.concat(parts))
