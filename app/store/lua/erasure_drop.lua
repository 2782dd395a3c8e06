-- Deletes keys of one user's slot and adds what they held to the erasure marker's counts,
-- in one step, so a crash neither loses nor doubles a count.
-- The dropped keys are of the marker's slot, each with its kind (row, versions, snapshots,
-- blocks, activity, index). A row's versions are counted from its version order (versions),
-- which lists every one; its snapshots hash holds the earlier ones only and adds no count.
-- Without the marker it does nothing: counts land only in a running erasure, and a late call
-- from a process that lost the erasure cannot bring the marker back.
if redis.call('EXISTS', K_marker) == 0 then return {'NOMARK'} end
local structured_key = A_structured_key
local counts = {}
local function add(kind, n)
  if n > 0 then counts[kind] = (counts[kind] or 0) + n end
end
local function size(key)
  local t = redis.call('TYPE', key).ok
  if t == 'hash' then return redis.call('HLEN', key) end
  if t == 'zset' then return redis.call('ZCARD', key) end
  if t == 'set' then return redis.call('SCARD', key) end
  if t == 'list' then return redis.call('LLEN', key) end
  if t == 'none' then return 0 end
  return 1
end
for i = 0, #ARGV - A_kinds_from do
  local key, kind = KEYS[K_dropped_from + i], ARGV[A_kinds_from + i]
  if key ~= K_marker and redis.call('EXISTS', key) == 1 then
    if kind == 'row' then
      local f = redis.call('HMGET', key, 'memory_type', 'key', 'agent', 'session_id')
      if f[1] == 'profile' and f[2] == structured_key and f[3] == '-' and f[4] == '-' then
        add('structured_profiles', 1)
      elseif f[1] == 'profile' then
        add('profile_sections', 1)
      else
        add('memory_rows', 1)
      end
    elseif kind == 'versions' then
      add('memory_versions', size(key))
    elseif kind == 'snapshots' then
      -- Counted by the row's version order.
      add('memory_versions', 0)
    elseif kind == 'blocks' then
      add('working_memory_blocks', size(key))
    elseif kind == 'activity' then
      add('activity_entries', size(key))
    else
      add('index_entries', size(key))
    end
    redis.call('DEL', key)
  end
end
local reply = {'OK'}
for kind, n in pairs(counts) do
  redis.call('HINCRBY', K_marker, kind, n)
  reply[#reply + 1] = kind
  reply[#reply + 1] = tostring(n)
end
return reply
