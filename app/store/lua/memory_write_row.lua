-- A memory write's row and versions (included by memory_write): the row's fields, its version
-- snapshots and order, and its entries in the user's rows, ids, sections and live rows.
local function load_row()
  local flat = redis.call('HGETALL', K_row)
  if #flat == 0 then return nil end
  local r = {}
  for i = 1, #flat, 2 do r[flat[i]] = flat[i + 1] end
  return r
end

local function flatten(r)
  local flat = {}
  for k, v in pairs(r) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  return flat
end

local function pad(v) return string.rep('0', 20 - #v) .. v end

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

-- r as the row's current fields and its version's snapshot, listed in the user's rows, ids,
-- sections and live rows. old_type: the row's memory_type before the write (nil for a new row).
local function write_row(r, member, old_type)
  redis.call('HSET', K_row, unpack(flatten(r)))
  local padded = pad(r.version)
  redis.call('HSET', K_versions, padded, cjson.encode(r))
  redis.call('ZADD', K_version_order, 0, padded)
  redis.call('ZADD', K_rows, 0, member)
  redis.call('HSET', K_memory_ids, r.memory_id, K_row)
  index_section(r.key, r.agent, r.session_id,
    r.memory_type == 'profile' and r.deleted ~= '1' and r.redacted ~= '1')
  index_live(r, old_type, member)
end
