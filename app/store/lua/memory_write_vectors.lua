-- A memory write's vector due list (included by memory_write): the row's stale vector leaves,
-- the row waits for the embeddings job, and the job the caller enqueues is marked queued.
-- A change to the user's vectors: a search process drops its decoded copy. The birth time
-- makes a generation of vectors written after an erasure never equal one from before it.
local function bump_vector_generation(key)
  local t = redis.call('TIME')
  redis.call('HSETNX', key, 'born', t[1] .. '.' .. t[2])
  redis.call('HINCRBY', key, 'n', 1)
end

-- The row's vector goes (its text changed): out of the user's vectors and, where the vector set
-- holds it, out of the set in the same step (the key exists only on a server with the engine, so
-- no other server is sent VREM); VECTOR_LEFT names it for the namespace's set.
local function drop_vector(mid)
  if redis.call('HDEL', K_recall_vectors, mid) == 1 then
    bump_vector_generation(K_recall_vectors_generation)
    if redis.call('EXISTS', K_recall_vector_set) == 1 then
      redis.call('VREM', K_recall_vector_set, mid)
      VECTOR_LEFT = mid
    end
  end
end

-- The row waits for a vector (due) or no longer does.
local function list_due(mid, due)
  if due then
    redis.call('ZADD', K_recall_vectors_due, 0, mid)
  else
    redis.call('ZREM', K_recall_vectors_due, mid)
  end
end

-- The embeddings job the caller enqueues after this write: the tail's job id when the write
-- left a live, unredacted fact, the user has rows due for a vector and no job of the user is
-- queued (the marker, in the user's slot, is set to that id in this step, NX); else ''. A
-- user's steady writes so cost no step beyond the script (app/store/recall_vectors.py).
local function embed_job_of(status, r)
  local job = TAIL.embed_job or ''
  if job == '' or status == 'NOOP' then return '' end
  if r.deleted == '1' or r.redacted == '1' or r.memory_type == 'profile' then return '' end
  if redis.call('EXISTS', K_erasing) == 1 or redis.call('ZCARD', K_recall_vectors_due) == 0 then return '' end
  if redis.call('SET', K_recall_vectors_queued, job, 'NX', 'EX', TAIL.embed_ttl) then return job end
  return ''
end
