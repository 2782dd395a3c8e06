-- KEYS and ARGV: app/store/script_interfaces.py MEMORY_RELAYOUT. Moves one row written by the
-- earlier layout onto this one, in one step beside live writes: the row and its snapshots lose
-- the fields at their default, and the current version leaves the versions hash (the row holds
-- it). A row already on this layout is left alone: answers 1 when it wrote, else 0.
--#include memory_row_form
local flat = redis.call('HGETALL', K_row)
if #flat == 0 then return 0 end
local r = {}
for i = 1, #flat, 2 do r[flat[i]] = flat[i + 1] end
local wrote = 0
local drop = {}
for k, v in pairs(r) do
  if ROW_DEFAULTS[k] == v then drop[#drop + 1] = k end
end
if #drop > 0 then
  redis.call('HDEL', K_row, unpack(drop))
  wrote = 1
end
local current = pad(r.version)
if redis.call('HDEL', K_versions, current) == 1 then
  -- The order keeps listing it: the row is that version.
  redis.call('ZADD', K_version_order, 0, current)
  wrote = 1
end
local versions = redis.call('HGETALL', K_versions)
for i = 1, #versions, 2 do
  local s = cjson.decode(versions[i + 1])
  if holds_defaults(s) then
    redis.call('HSET', K_versions, versions[i], stored_json(s))
    wrote = 1
  end
end
return wrote
