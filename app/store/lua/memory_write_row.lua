-- A memory write's row and versions (included by memory_write): the row's fields, its version
-- snapshots and order, and its entries in the user's rows, ids, sections and live rows.
-- The row holds its current version once: the versions hash keeps the earlier ones (a row
-- written by the earlier layout also holds its current one there; a write replaces it).
--#include memory_row_form

-- The row as this script found it (every field), kept as a version when the write replaces it.
local LOADED = nil

local function load_row()
  local flat = redis.call('HGETALL', K_row)
  if #flat == 0 then return nil end
  local r, loaded = {}, {}
  for i = 1, #flat, 2 do
    r[flat[i]] = flat[i + 1]
    loaded[flat[i]] = flat[i + 1]
  end
  LOADED = expanded(loaded)
  return expanded(r)
end

-- The snapshot of the padded version (every field), or nil when the row has no such version:
-- an earlier one from the versions hash, the current one from the row as found.
local function snapshot_of(padded)
  local stored = redis.call('HGET', K_versions, padded)
  if stored then return expanded(cjson.decode(stored)) end
  if LOADED and padded == pad(LOADED.version)
    and redis.call('ZSCORE', K_version_order, padded) then
    local copy = {}
    for k, v in pairs(LOADED) do copy[k] = v end
    return copy
  end
  return nil
end

-- Whether the row has the padded version (the order lists every version, the current one too).
local function has_version(padded)
  return redis.call('ZSCORE', K_version_order, padded) ~= false
end

-- What wrote a version (memory.history shows it): the op's word, and for a revert or a
-- restore the version whose content it brought back ('' otherwise).
local function mark(r, change, from_version)
  r.change = change
  r.from_version = from_version or ''
end

-- The section's three entries in the user's section index (keys.profile_sections).
local function section_members(key, agent, session_id)
  return {
    'l' .. NUL .. key .. NUL .. agent .. NUL .. session_id,
    'a' .. NUL .. agent .. NUL .. key .. NUL .. session_id,
    's' .. NUL .. session_id .. NUL .. key .. NUL .. agent,
  }
end

local function index_section(key, agent, session_id, renderable)
  local members = section_members(key, agent, session_id)
  if renderable then
    redis.call('ZADD', K_sections, 0, members[1], 0, members[2], 0, members[3])
  else
    redis.call('ZREM', K_sections, members[1], members[2], members[3])
  end
end

-- The row's entries in the user's live rows (keys.memory_live); old_type is the type it had
-- before this write (nil for a new row), whose entry goes when the type changes.
local function index_live(r, old_type, member)
  if old_type and old_type ~= r.memory_type then
    redis.call('ZREM', K_live, old_type .. NUL .. member)
  end
  if r.deleted == '1' then
    redis.call('ZREM', K_live, r.memory_type .. NUL .. member, NUL .. member)
  else
    redis.call('ZADD', K_live, 0, r.memory_type .. NUL .. member, 0, NUL .. member)
  end
end

-- r as the row's current fields and newest version, listed in the user's rows, ids, sections
-- and live rows; the version it replaces (unless a delete_version removed it) moves to the
-- versions hash. old_type: the row's memory_type before the write (nil for a new row).
local function write_row(r, member, old_type)
  if LOADED and LOADED.version ~= r.version and has_version(pad(LOADED.version)) then
    redis.call('HSET', K_versions, pad(LOADED.version), stored_json(LOADED))
  end
  -- Whole, so a field back at its default leaves the row.
  redis.call('DEL', K_row)
  redis.call('HSET', K_row, unpack(stored_flat(r)))
  redis.call('ZADD', K_version_order, 0, pad(r.version))
  redis.call('ZADD', K_rows, 0, member)
  redis.call('HSET', K_memory_ids, r.memory_id, K_row)
  index_section(r.key, r.agent, r.session_id,
    r.memory_type == 'profile' and r.deleted ~= '1' and r.redacted ~= '1')
  index_live(r, old_type, member)
end
