-- Settles a key's record: 'done' keeps the answer, 'unknown' marks the outcome unknown,
-- 'release' gives the key up. Only the holder of a running reservation settles it; the record
-- keeps the life its reservation gave it.
if redis.call('HGET', K_record, 'holder') ~= A_holder
   or redis.call('HGET', K_record, 'state') ~= 'running' then
  return 0
end
if A_outcome == 'release' then return redis.call('DEL', K_record) end
if A_outcome == 'done' then
  redis.call('HSET', K_record, 'state', 'done', 'answer', A_answer)
else
  redis.call('HSET', K_record, 'state', 'unknown')
end
return 1
