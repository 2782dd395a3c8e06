-- KEYS and ARGV: app/store/script_interfaces.py MEMORY_TOUCH.
-- A new version with the row's content. A restatement or a reinforcement is a change of the
-- fact (the user said it again): it dates the fact now and moves it to the newest place the
-- builds read. A recall (the fact was used) or a backfill (its recall index entry brought up
-- to date) is none: the row's last change stays, and so does its source entry.
--#include memory_write
local r, err = target(A_memory_id)
if err then return err end
if r.deleted == '1' then return {'MISSING'} end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
local change = A_change
-- Whether the row has a vector a search can score: in the vector set on the engine (and, on
-- one server, where the script reaches it, in the namespace's set too: a database from before
-- that set is listed and embedded again), else as the payload after the fingerprint in the
-- user's vector hash.
local function has_vector(mid)
  if A_vector_engine == '1' then
    return redis.call('VISMEMBER', K_recall_vector_set, mid) == 1 and (not TAIL.apply
      or redis.call('VISMEMBER', K_namespace_vector_set, TAIL.user_id .. NUL .. mid) == 1)
  end
  local stored = redis.call('HGET', K_recall_vectors, mid)
  return stored ~= false and string.find(stored, ':', 1, true) ~= nil
end
local function bump(name) r[name] = tostring(tonumber(r[name] or '0') + 1) end
if change == 'reinforce' then
  bump('reinforce_count')
  if A_confidence ~= '' and tonumber(A_confidence) > tonumber(r.confidence) then r.confidence = A_confidence end
elseif change == 'recall' then
  bump('recall_count')
  r.recalled_at = A_now
elseif change == 'backfill' then
  -- The terms were computed from what the row held at that version: another write since then
  -- may have changed them, so read again.
  if r.version ~= A_expected_version then return {'CONFLICT'} end
  local indexed = redis.call('HGET', K_recall_docs, r.memory_id)
  local wants = A_recall_terms ~= '' and r.redacted ~= '1' and r.memory_type ~= 'profile'
  local vector_or_due = has_vector(r.memory_id)
    or redis.call('ZSCORE', K_recall_vectors_due, r.memory_id) ~= false
  if (r.recall_terms or '') == A_recall_terms and
    ((wants and indexed == A_recall_terms and vector_or_due) or (not wants and indexed == false)) then
    return done('NOOP', false, r)
  end
  r.recall_terms = A_recall_terms
end
r.written_by = A_written_by
mark(r, change)
local keep = change == 'recall' or change == 'backfill'
local moved = commit(r, A_now, A_member, r.memory_type, keep)
if change == 'backfill' and r.recall_terms ~= '' and r.redacted ~= '1'
  and r.memory_type ~= 'profile' and not has_vector(r.memory_id) then
  -- Terms that were already current leave the vector queue alone in index_recall: a row
  -- with no vector is listed for the embeddings job all the same.
  redis.call('ZADD', K_recall_vectors_due, 0, r.memory_id)
end
return done('OK', moved, r)
