-- A write of a row's content (memory.set, and append/replace through a compare-and-swap).
-- KEYS and ARGV: app/store/script_interfaces.py MEMORY_SET. After the declared arguments, the
-- record's field/value pairs (A_record_pairs of them: a hash written in the same step as the
-- row, so no reader sees the row without it), then the field/value pairs of the new content.
--#include memory_write
if redis.call('EXISTS', K_erasing) == 1 then return {'ERASING'} end
if A_fence_token ~= '' and redis.call('GET', K_fence) ~= A_fence_token then return {'FENCED'} end
local r = load_row()
local live = r and r.deleted ~= '1'
if r and r.locked == '1' then return {'LOCKED', r.memory_id} end
if A_refuse_pinned == '1' and live and (r.pinned == '1' or r.label == 'high') then
  return {'PINNED', r.memory_id}
end
if A_required_type ~= '' and live and r.memory_type ~= A_required_type then
  return {'TYPE', r.memory_type}
end
local expected = A_expected_version
if expected == '-' then
  if live then return {'CONFLICT'} end
elseif expected ~= '' then
  if not live or r.version ~= expected then return {'CONFLICT'} end
end
if A_if_match ~= '' then
  local current = ''
  if live then current = r.content_sha256 end
  if current ~= A_if_match then return {'MISMATCH', current} end
end
local created = false
local old_type = r and r.memory_type
if not r then
  created = true
  r = {memory_id = A_memory_id, pinned = '0', locked = '0', version = '', created_at = ''}
end
local limit = A_char_limit
if limit == '' then limit = r.char_limit or '' end
if limit == '' then limit = A_default_char_limit end
local record_end = A_pairs_from - 1 + 2 * tonumber(A_record_pairs)
for i = record_end + 1, #ARGV, 2 do r[ARGV[i]] = ARGV[i + 1] end
r.char_limit = limit
if limit ~= '' and tonumber(r.value_length) > tonumber(limit) then
  return {'LIMIT', r.value_length, limit}
end
r.deleted = '0'
r.redacted = '0'
r.written_by = A_written_by
mark(r, 'write')
local moved = commit(r, A_now, A_member, old_type)
if record_end >= A_pairs_from then
  redis.call('HSET', K_record, unpack(ARGV, A_pairs_from, record_end))
end
if created then return done('CREATED', moved, r) end
return done('OK', moved, r)
