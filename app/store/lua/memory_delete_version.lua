-- KEYS and ARGV: app/store/script_interfaces.py MEMORY_DELETE_VERSION. The removal is recorded
-- as a new version carrying the newest remaining version's content (a tombstone when none is
-- left) under the marker trace (A_source_trace).
--#include memory_write
local r, err = target(A_memory_id)
if err then return err end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
if not has_version(A_version) then return {'NO_VERSION'} end
redis.call('HDEL', K_versions, A_version)
redis.call('ZREM', K_version_order, A_version)
local newest = redis.call('ZREVRANGEBYLEX', K_version_order, '+', '-', 'LIMIT', 0, 1)
local n = {}
if newest[1] then
  n = snapshot_of(newest[1])
else
  for k, v in pairs(r) do n[k] = v end
  n.deleted = '1'
  n.value = 'null'
  n.value_length = '4'
  n.content_sha256 = ''
  n.recall_terms = ''
end
-- Row-level facts stay the row's: its id, birth, last version and flags.
n.memory_id = r.memory_id
n.created_at = r.created_at
n.version = r.version
n.pinned = r.pinned
n.locked = r.locked
n.recall_count = r.recall_count
n.recalled_at = r.recalled_at
n.reinforce_count = r.reinforce_count
mark(n, 'delete_version')
n.source_trace = A_source_trace
n.written_by = A_written_by
return done('OK', commit(n, A_now, A_member, r.memory_type), n)
