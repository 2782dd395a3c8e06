-- KEYS: see memory_write. ARGV: 1 now, 2 memory_id for a new row, 3 rows-set member,
-- 4 expected version ('' none, '-' no live row), 5 if_match sha ('' none), 6 default char_limit
-- ('' none), 7 char_limit ('' keeps the row's), 8 written_by, 9 required type of a live row
-- ('' any), 10 refuse pinned/high ('1'), 11 a lease's fencing token ('' none; KEYS[20] is
-- then its fence, in the user's slot), 12 n, the field/value pairs of a hash written in the
-- same step as the row (0 none; else the key after the shared ones and the fence, in the
-- user's slot: a structured build's record, so no reader sees the row without it), 13..12+2n
-- those pairs, then the field/value pairs of the new content, then the tail (memory_write).
--#include memory_write
if redis.call('EXISTS', KEYS[10]) == 1 then return {'ERASING'} end
if ARGV[11] ~= '' and redis.call('GET', KEYS[SHARED_KEYS + 1]) ~= ARGV[11] then return {'FENCED'} end
local r = load_row()
local live = r and r.deleted ~= '1'
if r and r.locked == '1' then return {'LOCKED', r.memory_id} end
if ARGV[10] == '1' and live and (r.pinned == '1' or r.label == 'high') then
  return {'PINNED', r.memory_id}
end
if ARGV[9] ~= '' and live and r.memory_type ~= ARGV[9] then
  return {'TYPE', r.memory_type}
end
local expected = ARGV[4]
if expected == '-' then
  if live then return {'CONFLICT'} end
elseif expected ~= '' then
  if not live or r.version ~= expected then return {'CONFLICT'} end
end
if ARGV[5] ~= '' then
  local current = ''
  if live then current = r.content_sha256 end
  if current ~= ARGV[5] then return {'MISMATCH', current} end
end
local created = false
local old_type = r and r.memory_type
if not r then
  created = true
  r = {memory_id = ARGV[2], pinned = '0', locked = '0', version = '', created_at = ''}
end
local limit = ARGV[7]
if limit == '' then limit = r.char_limit or '' end
if limit == '' then limit = ARGV[6] end
local record_end = 12 + 2 * tonumber(ARGV[12])
for i = record_end + 1, #ARGV - 1, 2 do r[ARGV[i]] = ARGV[i + 1] end
r.char_limit = limit
if limit ~= '' and tonumber(r.value_length) > tonumber(limit) then
  return {'LIMIT', r.value_length, limit}
end
r.deleted = '0'
r.redacted = '0'
r.written_by = ARGV[8]
mark(r, 'write')
local moved = commit(r, ARGV[1], ARGV[3], old_type)
if record_end > 12 then
  local record_key = SHARED_KEYS + 1
  if ARGV[11] ~= '' then record_key = record_key + 1 end
  redis.call('HSET', KEYS[record_key], unpack(ARGV, 13, record_end))
end
if created then return done('CREATED', moved, r) end
return done('OK', moved, r)
