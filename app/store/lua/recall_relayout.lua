-- One step of moving a user's lexical recall index to the posting layout of
-- recall_posting.lua. KEYS: 1 recall postings, 2 recall docs, 3 recall stats. ARGV: 1 the
-- HSCAN cursor over the docs ('0' to start), 2 how many docs a step takes. Each doc the step
-- reads has its layout 1 postings replaced by layout 2 ones; when the scan ends the stats say
-- layout = 2 and searches prune. HSCAN returns every doc present for the whole scan, and a doc
-- written meanwhile is written on layout 2 already (memory_write.lua), so none is left behind.
-- Answers {next cursor ('0': done), docs moved}.
--#include recall_posting
if redis.call('HGET', KEYS[3], 'layout') == LAYOUT then return {'0', 0} end
local reply = redis.call('HSCAN', KEYS[2], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local flat, moved = reply[2], 0
for i = 1, #flat, 2 do
  local mid = flat[i]
  local found, len = recall_pairs(flat[i + 1])
  local old = recall_postings_into({}, found, len, mid, '1', false)
  local new = recall_postings_into({}, found, len, mid, LAYOUT, true)
  if #old > 0 then
    redis.call('ZREM', KEYS[1], unpack(old))
    redis.call('ZADD', KEYS[1], unpack(new))
  end
  moved = moved + 1
end
if reply[1] == '0' then redis.call('HSET', KEYS[3], 'layout', LAYOUT) end
return {reply[1], moved}
