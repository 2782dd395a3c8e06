-- Store the vector the embeddings job computed for one row, unless the row moved meanwhile.
-- KEYS: 1 the row, 2 recall vectors, 3 rows due for a vector, 4 the user's erasure marker,
-- 5 the vectors' generation (bumped by every change to them), 6 the user's vector set.
-- ARGV: 1 memory_id, 2 the row's version the text was read at, 3 the value for KEYS[2]
-- ('' stores nothing: the vector there is already of this text), 4 on a server with vector
-- sets the vector as FP32 bytes for KEYS[6] (KEYS[2] then gets the fingerprint alone), else '',
-- 5 the namespace's vector set (keys.recall_namespace_vector_set) on one server, where the
-- script keeps it itself; '' on Redis Cluster, where it lies in another slot and the caller
-- sends what the reply's second field names ('add' or 'remove') after, 6 the fact's element
-- there, 7 its attributes (JSON).
-- Answers OK (stored, or kept), MOVED (a later write changed the row: its own job embeds it,
-- the row stays due), GONE (the row left the index: nothing stored, no longer due) or ERASING.
local function bump_generation()
  local t = redis.call('TIME')
  redis.call('HSETNX', KEYS[5], 'born', t[1] .. '.' .. t[2])
  redis.call('HINCRBY', KEYS[5], 'n', 1)
end
if redis.call('EXISTS', KEYS[4]) == 1 then return {'ERASING'} end
local mid = ARGV[1]
-- The namespace's set follows the user's: the same vector under the user's element, or none.
local function namespace_set(change)
  if ARGV[5] == '' then return change end
  if change == 'remove' then
    if redis.call('EXISTS', ARGV[5]) == 1 then redis.call('VREM', ARGV[5], ARGV[6]) end
  else
    if redis.call('EXISTS', ARGV[5]) == 1
        and redis.call('VDIM', ARGV[5]) * 4 ~= string.len(ARGV[4]) then
      redis.call('DEL', ARGV[5])
    end
    redis.call('VADD', ARGV[5], 'FP32', ARGV[4], ARGV[6], 'Q8', 'SETATTR', ARGV[7])
  end
  return ''
end
local row = redis.call('HMGET', KEYS[1], 'memory_id', 'version', 'deleted', 'redacted',
  'memory_type', 'recall_terms')
if row[1] ~= mid then
  redis.call('ZREM', KEYS[3], mid)
  return {'GONE'}
end
if row[2] ~= ARGV[2] then return {'MOVED'} end
if row[3] == '1' or row[4] == '1' or row[5] == 'profile' or (row[6] or '') == '' then
  if redis.call('HDEL', KEYS[2], mid) == 1 then bump_generation() end
  local left = ''
  if redis.call('EXISTS', KEYS[6]) == 1 then
    redis.call('VREM', KEYS[6], mid)
    left = namespace_set('remove')
  end
  redis.call('ZREM', KEYS[3], mid)
  return {'GONE', left}
end
local left = ''
if ARGV[3] ~= '' then
  if ARGV[4] ~= '' then
    -- A set holds vectors of one length: a vector of another (the model changed) starts the
    -- set again, as the exact path scores only vectors of the query's length.
    if redis.call('EXISTS', KEYS[6]) == 1
        and redis.call('VDIM', KEYS[6]) * 4 ~= string.len(ARGV[4]) then
      redis.call('DEL', KEYS[6])
    end
    redis.call('VADD', KEYS[6], 'FP32', ARGV[4], mid, 'Q8')
    left = namespace_set('add')
  end
  redis.call('HSET', KEYS[2], mid, ARGV[3])
  bump_generation()
end
redis.call('ZREM', KEYS[3], mid)
return {'OK', left}
