-- KEYS and ARGV: app/store/script_interfaces.py WORKING_MEMORY_APPEND.
--#include version
--#include working_memory_parse
if erasing() then return {'ERASING'} end
local raw = redis.call('HGET', K_scope, A_block_key)
local last, limit, length, content
if raw then
  local v, l, n, pos = parse(raw)
  last, limit = v, l
  length = n + tonumber(A_separator_length) + tonumber(A_addition_length)
  if length > limit then return {'LIMIT', length, limit} end
  content = string.sub(raw, pos) .. A_separator .. A_addition
else
  limit = tonumber(A_default_char_limit)
  length = tonumber(A_addition_length)
  if length > limit then return {'LIMIT', length, limit} end
  content = A_addition
end
return store(K_scope, K_index, A_block_key, next_version(last, A_now), limit, length, content)
