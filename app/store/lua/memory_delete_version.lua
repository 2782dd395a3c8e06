-- KEYS: see memory_write. ARGV: 1 now, 2 padded version to remove, 3 written_by, 4 rows-set
-- member, 5 expected memory_id, 6 the marker's source_trace. The removal is recorded as a new
-- version carrying the newest remaining version's content (a tombstone when none is left)
-- under the marker trace.
--#include memory_write
local r, err = target(ARGV[5])
if err then return err end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then return {'NO_VERSION'} end
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
local newest = redis.call('ZREVRANGEBYLEX', KEYS[3], '+', '-', 'LIMIT', 0, 1)
local n = {}
if newest[1] then
  for k, v in pairs(cjson.decode(redis.call('HGET', KEYS[2], newest[1]))) do n[k] = v end
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
n.source_trace = ARGV[6]
n.written_by = ARGV[3]
return done('OK', commit(n, ARGV[1], ARGV[4], r.memory_type), n)
