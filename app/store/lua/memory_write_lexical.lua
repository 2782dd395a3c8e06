-- A memory write's lexical recall index (included by memory_write, after memory_write_vectors).
--#include recall_posting
-- The row's entries in the user's lexical recall index (keys.recall_*): its current terms
-- when it is a live, unredacted fact with terms, none otherwise. A write that leaves the terms
-- as they were (a lock, a pin) touches nothing but one HGET.
local function index_recall(r)
  local mid = r.memory_id
  local old = redis.call('HGET', K_recall_docs, mid)
  if old == false then old = nil end
  local new = r.recall_terms
  if new == '' or r.deleted == '1' or r.redacted == '1' or r.memory_type == 'profile' then
    new = nil
  end
  if old == new then return end
  -- The vector described the old text: it goes, and the row waits for the embeddings job.
  drop_vector(mid)
  list_due(mid, new ~= nil)
  -- A user still on layout 1 (recall_posting.lua) may hold the old row's postings in either
  -- form; a user with no document starts on layout 2.
  local stats = redis.call('HMGET', K_recall_stats, 'docs', 'layout')
  local current = stats[2] == LAYOUT
  if not current and tonumber(stats[1] or '0') == 0 then
    redis.call('HSET', K_recall_stats, 'layout', LAYOUT)
    current = true
  end
  local docs, length = 0, 0
  if old then
    local found, len = recall_pairs(old)
    local members = recall_postings_into({}, found, len, mid, LAYOUT, false)
    if not current then recall_postings_into(members, found, len, mid, '1', false) end
    if #members > 0 then redis.call('ZREM', K_recall_postings, unpack(members)) end
    redis.call('HDEL', K_recall_docs, mid)
    docs, length = docs - 1, length - len
  end
  if new then
    local found, len = recall_pairs(new)
    local args = recall_postings_into({}, found, len, mid, LAYOUT, true)
    if #args > 0 then redis.call('ZADD', K_recall_postings, unpack(args)) end
    redis.call('HSET', K_recall_docs, mid, new)
    docs, length = docs + 1, length + len
  end
  if docs ~= 0 then redis.call('HINCRBY', K_recall_stats, 'docs', docs) end
  if length ~= 0 then redis.call('HINCRBY', K_recall_stats, 'length', length) end
end
