-- KEYS and ARGV: app/store/script_interfaces.py MEMORY_REDACT (per derived row, its row key and
-- versions key after the declared keys). Scrubs every
-- version of the row in place (no new version: the history keeps its shape, without the
-- text), and every profile version of a derived row whose source_trace names the row's
-- memory_id, the derived row's current fields too when they do. Refused whole when the row or
-- a derived row is locked, so a redact is all or nothing and a retry reaches the same keys.
--#include memory_write
local r, err = target(A_memory_id)
if err then return err end
if r.locked == '1' then return {'LOCKED', r.memory_id} end
local function names(trace, mid)
  for token in string.gmatch(trace or '', '[^:,]+') do
    if token == mid then return true end
  end
  return false
end
local function scrub(s)
  s.value = 'null'
  s.value_length = '4'
  s.content_sha256 = ''
  s.recall_terms = ''
  s.redacted = '1'
end
local derived = tonumber(A_derived_count)
for d = 1, derived do
  local flags = redis.call('HMGET', KEYS[K_derived_from - 2 + 2 * d], 'locked', 'key', 'memory_id')
  if flags[1] == '1' then return {'DERIVED_LOCKED', flags[2] or '', flags[3] or ''} end
end
local versions = redis.call('HGETALL', K_versions)
local count = 0
for i = 1, #versions, 2 do
  local s = cjson.decode(versions[i + 1])
  scrub(s)
  redis.call('HSET', K_versions, versions[i], stored_json(s))
  count = count + 1
end
-- The current version, which lives in the row (unless the earlier layout kept it here too).
if redis.call('HEXISTS', K_versions, pad(r.version)) == 0 then count = count + 1 end
scrub(r)
r.redacted_by = A_written_by
redis.call('HSET', K_row, 'value', r.value, 'value_length', r.value_length,
  'content_sha256', '', 'redacted', '1', 'redacted_by', A_written_by)
redis.call('HDEL', K_row, 'recall_terms')
-- A redacted fact is never found again: its terms leave the recall index with its text.
index_recall(r)
-- A redacted section renders nothing: it leaves the section index until it is written again.
index_section(r.key, r.agent, r.session_id, false)
local reached, rows = 0, 0
for d = 1, derived do
  local rk, vk = KEYS[K_derived_from - 2 + 2 * d], KEYS[K_derived_from - 1 + 2 * d]
  local touched = false
  local all = redis.call('HGETALL', vk)
  for i = 1, #all, 2 do
    local s = cjson.decode(all[i + 1])
    if s.memory_type == 'profile' and names(s.source_trace, r.memory_id) then
      scrub(s)
      redis.call('HSET', vk, all[i], stored_json(s))
      reached = reached + 1
      touched = true
    end
  end
  local current = redis.call('HMGET', rk, 'memory_type', 'source_trace', 'key', 'agent',
    'session_id', 'version')
  if current[1] == 'profile' and names(current[2], r.memory_id) then
    redis.call('HSET', rk, 'value', 'null', 'value_length', '4', 'content_sha256', '',
      'redacted', '1', 'redacted_by', A_written_by)
    index_section(current[3], current[4], current[5], false)
    -- Its current version lives in the row (unless the earlier layout kept it in vk too).
    if redis.call('HEXISTS', vk, pad(current[6])) == 0 then reached = reached + 1 end
    touched = true
  end
  if touched then rows = rows + 1 end
end
local moved = update_sources(K_sources, K_digest, K_source_expiry, r.memory_id, nil, '', A_now)
local reply = reply_of('OK', moved, r, A_now, true)
reply[#reply + 1] = 'versions_redacted'
reply[#reply + 1] = tostring(count)
reply[#reply + 1] = 'derived_versions_redacted'
reply[#reply + 1] = tostring(reached)
reply[#reply + 1] = 'derived_rows_redacted'
reply[#reply + 1] = tostring(rows)
return answered(reply)
