-- Drops the index entries of erased states (the declaration says what each entry holds).
-- An entry is dropped only while its score is not above that expiry: a write made since has
-- raised the score (ZADD GT) and keeps its entry.
local function drop(key, member, expires)
  local score = redis.call('ZSCORE', key, member)
  if score and tonumber(score) <= tonumber(expires) then redis.call('ZREM', key, member) end
end
for i = 0, (#ARGV - A_entries_from + 1) / 4 - 1 do
  local at = A_entries_from + 4 * i
  local member, expires, subject = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local subject_index = KEYS[K_subject_indexes_from + i]
  if ARGV[at + 3] == '1' then drop(K_expiry, member, expires) end
  if subject ~= '' then
    drop(subject_index, member, expires)
    -- A writer adds to the subject index before the subjects set, so an empty index here
    -- means no write naming this subject is half done.
    if redis.call('ZCARD', subject_index) == 0 then redis.call('ZREM', K_subjects, subject) end
  end
end
return 0
