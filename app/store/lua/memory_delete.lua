-- A tombstone version of the row. KEYS and ARGV: app/store/script_interfaces.py MEMORY_DELETE.
--#include memory_write
local r, err = target(A_memory_id)
if err then return err end
if r.deleted == '1' then return done('NOOP', false, r) end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
r.deleted = '1'
r.value = 'null'
r.value_length = '4'
r.content_sha256 = ''
r.recall_terms = ''
r.source_trace = A_source_trace
r.written_by = A_written_by
mark(r, 'delete')
return done('OK', commit(r, A_now, A_member, r.memory_type), r)
