-- A memory write's profile digest (included by memory_write): the row's entry in the user's
-- sources, the XOR digest over them and the expiry index.
local SOURCE_TYPES = {semantic = true, preference = true, decision = true}

-- The row's entry in the user's sources, or nil when it is not a source now.
local function source_entry(r, now)
  if r.deleted == '1' or r.redacted == '1' then return nil end
  if not SOURCE_TYPES[r.memory_type] then return nil end
  if r.label == 'high' or (r.duplicate_of or '') ~= '' or r.tag_excluded == '1' then
    return nil
  end
  if (r.valid_to or '') ~= '' and not dec_gt(r.valid_to, now) then return nil end
  -- Dated by when it became true, else by its last change (updated_at), which a recall or a
  -- backfill keeps: their versions leave the entry, and so the digest, as it was.
  local date = r.valid_at or ''
  if date == '' then date = r.updated_at or '' end
  if date == '' then date = r.version end
  return r.content_sha256 .. ':' .. r.confidence .. ':' .. date
end

-- Move one source's entry in (src, dig, exp); true when the digest moved. The expiry index
-- follows valid_to even when the entry stays (a valid_at-dated fact whose valid_to moved).
local function update_sources(src, dig, exp, mid, entry, valid_to, at)
  local expiry_moved
  if entry and valid_to ~= '' then
    redis.call('ZADD', exp, valid_to, mid)
    expiry_moved = true
  else
    expiry_moved = redis.call('ZREM', exp, mid) == 1
  end
  if expiry_moved then
    local first = redis.call('ZRANGE', exp, 0, 0, 'WITHSCORES')
    redis.call('HSET', dig, 'next_expiry', first[2] or '')
  end
  local old = redis.call('HGET', src, mid)
  if old == false then old = nil end
  if old == entry then return false end
  local d = redis.call('HMGET', dig, 'digest', 'count')
  local digest = d[1] or ZERO
  local count = tonumber(d[2] or '0')
  if old then
    digest = xor_hex(digest, redis.sha1hex(mid .. '|' .. old))
    count = count - 1
  end
  if entry then
    digest = xor_hex(digest, redis.sha1hex(mid .. '|' .. entry))
    if count == 0 then FIRST_SOURCE = true end
    count = count + 1
    redis.call('HSET', src, mid, entry)
  else
    redis.call('HDEL', src, mid)
  end
  redis.call('HSET', dig, 'digest', digest, 'count', tostring(count), 'changed_at', at)
  if old and not entry then redis.call('HSET', dig, 'removed_at', at) end
  return true
end
