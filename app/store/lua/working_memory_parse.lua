-- The parse shared by every working-memory write script: version, cap, length and the
-- content's offset.
local function parse(raw)
  local v, l, n, pos = string.match(raw, '^(%d+):(%d+):(%d+):()')
  return v, tonumber(l), tonumber(n), pos
end
-- K_erasing marks the user as being erased: a write then would outlive the erasure.
local function erasing()
  return redis.call('EXISTS', K_erasing) == 1
end
local function store(key, index, field, version, limit, length, content)
  redis.call('HSET', key, field, version .. ':' .. limit .. ':' .. length .. ':' .. content)
  redis.call('SADD', index, key)
  return {'OK', version, limit, length}
end
