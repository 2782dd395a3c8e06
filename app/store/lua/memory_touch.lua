-- KEYS: see memory_write. ARGV: 1 now, 2 'restate' | 'reinforce' | 'recall' | 'backfill',
-- 3 written_by, 4 rows-set member, 5 expected memory_id ('' any), 6 reinforce: the confidence
-- to raise the row's to ('' keeps it), 7 backfill: the version the terms were computed from,
-- 8 backfill: the row's recall terms as this release computes them, 9 backfill: '1' when the
-- server's vectors live in vector sets (KEYS[18]), so a vector counts only where the set holds
-- it (a database moved onto the engine keeps int8 payloads in KEYS[15] that no search reads),
-- then the tail (memory_write).
-- A new version with the row's content. A restatement or a reinforcement is a change of the
-- fact (the user said it again): it dates the fact now and moves it to the newest place the
-- builds read. A recall (the fact was used) or a backfill (its recall index entry brought up
-- to date) is none: the row's last change stays, and so does its source entry.
--#include memory_write
local r, err = target(ARGV[5])
if err then return err end
if r.deleted == '1' then return {'MISSING'} end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
local change = ARGV[2]
-- Whether the row has a vector a search can score: in the vector set on the engine (and, on
-- one server, where the script reaches it, in the namespace's set too: a database from before
-- that set is listed and embedded again), else as the payload after the fingerprint in the
-- user's vector hash.
local function has_vector(mid)
  if ARGV[9] == '1' then
    return redis.call('VISMEMBER', KEYS[18], mid) == 1 and (not TAIL.apply
      or redis.call('VISMEMBER', TAIL.recall_vector_set, TAIL.user_id .. NUL .. mid) == 1)
  end
  local stored = redis.call('HGET', KEYS[15], mid)
  return stored ~= false and string.find(stored, ':', 1, true) ~= nil
end
local function bump(name) r[name] = tostring(tonumber(r[name] or '0') + 1) end
if change == 'reinforce' then
  bump('reinforce_count')
  if ARGV[6] ~= '' and tonumber(ARGV[6]) > tonumber(r.confidence) then r.confidence = ARGV[6] end
elseif change == 'recall' then
  bump('recall_count')
  r.recalled_at = ARGV[1]
elseif change == 'backfill' then
  -- The terms were computed from what the row held at that version: another write since then
  -- may have changed them, so read again.
  if r.version ~= ARGV[7] then return {'CONFLICT'} end
  local indexed = redis.call('HGET', KEYS[12], r.memory_id)
  local wants = ARGV[8] ~= '' and r.redacted ~= '1' and r.memory_type ~= 'profile'
  local vector_or_due = has_vector(r.memory_id)
    or redis.call('ZSCORE', KEYS[16], r.memory_id) ~= false
  if (r.recall_terms or '') == ARGV[8] and
    ((wants and indexed == ARGV[8] and vector_or_due) or (not wants and indexed == false)) then
    return done('NOOP', false, r)
  end
  r.recall_terms = ARGV[8]
end
r.written_by = ARGV[3]
mark(r, change)
local keep = change == 'recall' or change == 'backfill'
local moved = commit(r, ARGV[1], ARGV[4], r.memory_type, keep)
if change == 'backfill' and r.recall_terms ~= '' and r.redacted ~= '1'
  and r.memory_type ~= 'profile' and not has_vector(r.memory_id) then
  -- Terms that were already current leave the vector queue alone in index_recall: a row
  -- with no vector is listed for the embeddings job all the same.
  redis.call('ZADD', KEYS[16], 0, r.memory_id)
end
return done('OK', moved, r)
