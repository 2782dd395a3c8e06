-- The stored form of a row and of its version snapshots (included by memory_write_row and
-- memory_relayout): a field at its default value is not stored, and a reader takes an absent
-- field as that value (app/store/memory_row.py ROW_DEFAULTS says the same in Python). The
-- identity (memory_id, key, agent, user_id, session_id), memory_type, version, created_at,
-- updated_at, value, value_length, confidence and change are always stored: a process of the
-- earlier layout still serving during a release reads and writes them (docs/decisions.md).
local ROW_DEFAULTS = {
  pinned = '0', locked = '0', deleted = '0', redacted = '0', tag_excluded = '0',
  valid_at = '', valid_to = '', duplicate_of = '', source_trace = '', actor = '',
  char_limit = '', from_version = '', recall_terms = '', tags = '[]', label = 'normal',
  provenance = 'stated',
}

-- r with every absent field at its default (in place), so a script reads every field.
local function expanded(r)
  for k, v in pairs(ROW_DEFAULTS) do
    if r[k] == nil then r[k] = v end
  end
  return r
end

-- r without the fields at their default: what is stored of it.
local function without_defaults(r)
  local kept = {}
  for k, v in pairs(r) do
    if ROW_DEFAULTS[k] ~= v then kept[k] = v end
  end
  return kept
end

-- r's fields as stored: a flat field/value list without the defaults.
local function stored_flat(r)
  local flat = {}
  for k, v in pairs(without_defaults(r)) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  return flat
end

-- r as a version snapshot: JSON without the defaults.
local function stored_json(r)
  return cjson.encode(without_defaults(r))
end

-- Whether a stored table holds a field at its default (the earlier layout's full form).
local function holds_defaults(r)
  for k, v in pairs(r) do
    if ROW_DEFAULTS[k] == v then return true end
  end
  return false
end

local function pad(v) return string.rep('0', 20 - #v) .. v end
