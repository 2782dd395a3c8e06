-- KEYS: see memory_write. ARGV: 1 now, 2 written_by, 3 rows-set member, 4 expected memory_id,
-- 5 source_trace.
--#include memory_write
local r, err = target(ARGV[4])
if err then return err end
if r.deleted == '1' then return done('NOOP', false, r) end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
r.deleted = '1'
r.value = 'null'
r.value_length = '4'
r.content_sha256 = ''
r.recall_terms = ''
r.source_trace = ARGV[5]
r.written_by = ARGV[2]
mark(r, 'delete')
return done('OK', commit(r, ARGV[1], ARGV[3], r.memory_type), r)
