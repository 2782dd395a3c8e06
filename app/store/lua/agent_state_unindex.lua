-- KEYS: the namespace's expiry set, its subjects set, then one subject index per entry (the
-- expiry set again when the entry names none). ARGV per entry: state key, the expiry (ms) its
-- erased state carried, the subject digest ('' none), '1' to drop it from the expiry set.
-- An entry is dropped only while its score is not above that expiry: a write made since has
-- raised the score (ZADD GT) and keeps its entry.
local function drop(key, member, expires)
  local score = redis.call('ZSCORE', key, member)
  if score and tonumber(score) <= tonumber(expires) then redis.call('ZREM', key, member) end
end
for i = 1, #ARGV / 4 do
  local member, expires, subject = ARGV[4 * i - 3], ARGV[4 * i - 2], ARGV[4 * i - 1]
  if ARGV[4 * i] == '1' then drop(KEYS[1], member, expires) end
  if subject ~= '' then
    drop(KEYS[2 + i], member, expires)
    -- A writer adds to the subject index before the subjects set, so an empty index here
    -- means no write naming this subject is half done.
    if redis.call('ZCARD', KEYS[2 + i]) == 0 then redis.call('ZREM', KEYS[2], subject) end
  end
end
return 0
