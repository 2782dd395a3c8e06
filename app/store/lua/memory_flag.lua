-- memory.lock / unlock / pin / unpin: A_flag (locked | pinned) set to A_on ('0' | '1').
-- KEYS and ARGV: app/store/script_interfaces.py MEMORY_FLAG.
--#include memory_write
local r, err = target(A_memory_id)
if err then return err end
if r.deleted == '1' then return {'MISSING'} end
if r.locked == '1' and not (A_flag == 'locked' and A_on == '0') then
  return {'LOCKED', r.memory_id}
end
if r[A_flag] == A_on then return done('NOOP', false, r) end
r[A_flag] = A_on
r.written_by = A_written_by
local words = {locked = {['1'] = 'lock', ['0'] = 'unlock'}, pinned = {['1'] = 'pin', ['0'] = 'unpin'}}
mark(r, words[A_flag][A_on])
return done('OK', commit(r, A_now, A_member, r.memory_type), r)
