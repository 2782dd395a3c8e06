-- Store the vector the embeddings job computed for one row, unless the row moved meanwhile.
-- Keys and arguments: app/store/script_interfaces.py RECALL_VECTOR_STORE. A_stored is the value
-- for K_recall_vectors ('' stores nothing: the vector there is already of this text); A_vector,
-- on a server with vector sets, the vector as FP32 bytes for K_recall_vector_set
-- (K_recall_vectors then gets the fingerprint alone), else ''. The namespace's set
-- (K_namespace_vector_set) holds the same vector under A_namespace_element: on one server
-- (A_namespace_set_given '1') the script keeps it itself; on Redis Cluster, where it lies in
-- another slot, the caller sends what the reply's second field names ('add' or 'remove') after.
-- Answers OK (stored, or kept), MOVED (a later write changed the row: its own job embeds it,
-- the row stays due), GONE (the row left the index: nothing stored, no longer due) or ERASING.
local function bump_generation()
  local t = redis.call('TIME')
  redis.call('HSETNX', K_recall_vectors_generation, 'born', t[1] .. '.' .. t[2])
  redis.call('HINCRBY', K_recall_vectors_generation, 'n', 1)
end
if redis.call('EXISTS', K_erasing) == 1 then return {'ERASING'} end
local mid = A_memory_id
-- The namespace's set follows the user's: the same vector under the user's element, or none.
local function namespace_set(change)
  if A_namespace_set_given ~= '1' then return change end
  if change == 'remove' then
    if redis.call('EXISTS', K_namespace_vector_set) == 1 then
      redis.call('VREM', K_namespace_vector_set, A_namespace_element)
    end
  else
    if redis.call('EXISTS', K_namespace_vector_set) == 1
        and redis.call('VDIM', K_namespace_vector_set) * 4 ~= string.len(A_vector) then
      redis.call('DEL', K_namespace_vector_set)
    end
    redis.call('VADD', K_namespace_vector_set, 'FP32', A_vector, A_namespace_element, 'Q8',
      'SETATTR', A_namespace_attributes)
  end
  return ''
end
local row = redis.call('HMGET', K_row, 'memory_id', 'version', 'deleted', 'redacted',
  'memory_type', 'recall_terms')
if row[1] ~= mid then
  redis.call('ZREM', K_recall_vectors_due, mid)
  return {'GONE'}
end
if row[2] ~= A_version then return {'MOVED'} end
if row[3] == '1' or row[4] == '1' or row[5] == 'profile' or (row[6] or '') == '' then
  if redis.call('HDEL', K_recall_vectors, mid) == 1 then bump_generation() end
  local left = ''
  if redis.call('EXISTS', K_recall_vector_set) == 1 then
    redis.call('VREM', K_recall_vector_set, mid)
    left = namespace_set('remove')
  end
  redis.call('ZREM', K_recall_vectors_due, mid)
  return {'GONE', left}
end
local left = ''
if A_stored ~= '' then
  if A_vector ~= '' then
    -- A set holds vectors of one length: a vector of another (the model changed) starts the
    -- set again, as the exact path scores only vectors of the query's length.
    if redis.call('EXISTS', K_recall_vector_set) == 1
        and redis.call('VDIM', K_recall_vector_set) * 4 ~= string.len(A_vector) then
      redis.call('DEL', K_recall_vector_set)
    end
    redis.call('VADD', K_recall_vector_set, 'FP32', A_vector, mid, 'Q8')
    left = namespace_set('add')
  end
  redis.call('HSET', K_recall_vectors, mid, A_stored)
  bump_generation()
end
redis.call('ZREM', K_recall_vectors_due, mid)
return {'OK', left}
