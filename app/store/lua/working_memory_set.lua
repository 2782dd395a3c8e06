-- KEYS and ARGV: app/store/script_interfaces.py WORKING_MEMORY_SET.
--#include version
--#include working_memory_parse
if erasing() then return {'ERASING'} end
local raw = redis.call('HGET', K_scope, A_block_key)
local last, limit = nil, tonumber(A_char_limit)
if raw then
  local v, l = parse(raw)
  last = v
  if not limit then limit = l end
end
if not limit then limit = tonumber(A_default_char_limit) end
local length = tonumber(A_length)
if length > limit then return {'LIMIT', length, limit} end
return store(K_scope, K_index, A_block_key, next_version(last, A_now), limit, length, A_content)
