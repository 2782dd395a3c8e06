-- One step of moving a user's lexical recall index to the posting layout of
-- recall_posting.lua. Keys and arguments as app/store/script_interfaces.py declares them
-- (RECALL_RELAYOUT): the user's recall postings, docs and stats; A_cursor the HSCAN cursor over
-- the docs ('0' to start), A_step how many docs a step takes. Each doc the step
-- reads has its layout 1 postings replaced by layout 2 ones; when the scan ends the stats say
-- layout = 2 and searches prune. HSCAN returns every doc present for the whole scan, and a doc
-- written meanwhile is written on layout 2 already (memory_write.lua), so none is left behind.
-- Answers {next cursor ('0': done), docs moved}.
--#include recall_posting
if redis.call('HGET', K_stats, 'layout') == LAYOUT then return {'0', 0} end
local reply = redis.call('HSCAN', K_docs, A_cursor, 'COUNT', tonumber(A_step))
local flat, moved = reply[2], 0
for i = 1, #flat, 2 do
  local mid = flat[i]
  local found, len = recall_pairs(flat[i + 1])
  local old = recall_postings_into({}, found, len, mid, '1', false)
  local new = recall_postings_into({}, found, len, mid, LAYOUT, true)
  if #old > 0 then
    redis.call('ZREM', K_postings, unpack(old))
    redis.call('ZADD', K_postings, unpack(new))
  end
  moved = moved + 1
end
if reply[1] == '0' then redis.call('HSET', K_stats, 'layout', LAYOUT) end
return {reply[1], moved}
