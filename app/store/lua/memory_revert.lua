-- KEYS and ARGV: app/store/script_interfaces.py MEMORY_REVERT.
-- The content of a stored version comes back as the row's next version: a revert names the
-- version, a restore brings a deleted row back with its newest version that is no deletion.
-- Row-level facts (id, birth, flags, cap, counts) stay the row's; the new version is a change
-- of the fact, so it dates it now unless its valid_at dates it.
--#include memory_write
local CONTENT = {'memory_type', 'value', 'value_length', 'content_sha256', 'confidence', 'tags',
  'tag_excluded', 'label', 'valid_at', 'valid_to', 'duplicate_of', 'provenance', 'source_trace',
  'actor', 'recall_terms'}
local r, err = target(A_memory_id)
if err then return err end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
local padded, snapshot = A_version, nil
if A_change == 'revert' then
  snapshot = snapshot_of(padded)
  if not snapshot then return {'NO_VERSION'} end
  if snapshot.deleted == '1' or snapshot.redacted == '1' then return {'EMPTY_VERSION'} end
else
  if r.deleted ~= '1' then return {'NOT_DELETED', r.memory_id} end
  -- Newest first: the last version before the delete that still holds content.
  local order = redis.call('ZREVRANGEBYLEX', K_version_order, '+', '-')
  for _, candidate in ipairs(order) do
    local s = snapshot_of(candidate)
    if s and s.deleted ~= '1' and s.redacted ~= '1' then
      padded, snapshot = candidate, s
      break
    end
  end
  if not snapshot then return {'NO_CONTENT'} end
end
local old_type = r.memory_type
for _, name in ipairs(CONTENT) do r[name] = snapshot[name] or '' end
if (r.char_limit or '') ~= '' and tonumber(r.value_length) > tonumber(r.char_limit) then
  return {'LIMIT', r.value_length, r.char_limit}
end
r.deleted = '0'
r.redacted = '0'
r.written_by = A_written_by
mark(r, A_change, string.gsub(padded, '^0+', '') .. '')
return done('OK', commit(r, A_now, A_member, old_type), r)
