-- KEYS: see memory_write. ARGV: 1 now, 2 field (locked | pinned), 3 '0' | '1', 4 written_by,
-- 5 rows-set member, 6 expected memory_id ('' any).
--#include memory_write
local r, err = target(ARGV[6])
if err then return err end
if r.deleted == '1' then return {'MISSING'} end
if r.locked == '1' and not (ARGV[2] == 'locked' and ARGV[3] == '0') then
  return {'LOCKED', r.memory_id}
end
if r[ARGV[2]] == ARGV[3] then return done('NOOP', false, r) end
r[ARGV[2]] = ARGV[3]
r.written_by = ARGV[4]
local words = {locked = {['1'] = 'lock', ['0'] = 'unlock'}, pinned = {['1'] = 'pin', ['0'] = 'unpin'}}
mark(r, words[ARGV[2]][ARGV[3]])
return done('OK', commit(r, ARGV[1], ARGV[5], r.memory_type), r)
