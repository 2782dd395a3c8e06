-- Store the vector the embeddings job computed for one row, unless the row moved meanwhile.
-- KEYS: 1 the row, 2 recall vectors, 3 rows due for a vector, 4 the user's erasure marker,
-- 5 the vectors' generation (bumped by every change to them).
-- ARGV: 1 memory_id, 2 the row's version the text was read at, 3 the stored value
-- ('' stores nothing: the vector there is already of this text).
-- Answers OK (stored, or kept), MOVED (a later write changed the row: its own job embeds it,
-- the row stays due), GONE (the row left the index: nothing stored, no longer due) or ERASING.
local function bump_generation()
  local t = redis.call('TIME')
  redis.call('HSETNX', KEYS[5], 'born', t[1] .. '.' .. t[2])
  redis.call('HINCRBY', KEYS[5], 'n', 1)
end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'ERASING'} end
local mid = ARGV[1]
local row = redis.call('HMGET', KEYS[1], 'memory_id', 'version', 'deleted', 'redacted',
  'memory_type', 'recall_terms')
if row[1] ~= mid then
  redis.call('ZREM', KEYS[3], mid)
  return {'GONE'}
end
if row[2] ~= ARGV[2] then return {'MOVED'} end
if row[3] == '1' or row[4] == '1' or row[5] == 'profile' or (row[6] or '') == '' then
  if redis.call('HDEL', KEYS[2], mid) == 1 then bump_generation() end
  redis.call('ZREM', KEYS[3], mid)
  return {'GONE'}
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[2], mid, ARGV[3])
  bump_generation()
end
redis.call('ZREM', KEYS[3], mid)
return {'OK'}
