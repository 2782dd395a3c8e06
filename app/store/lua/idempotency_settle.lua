-- KEYS: 1 the key's record. ARGV: 1 the holder, 2 the outcome: 'done' (3 the answer),
-- 'unknown' or 'release'. Only the holder of a running reservation settles it; the record
-- keeps the life its reservation gave it.
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], 'state') ~= 'running' then
  return 0
end
if ARGV[2] == 'release' then return redis.call('DEL', KEYS[1]) end
if ARGV[2] == 'done' then
  redis.call('HSET', KEYS[1], 'state', 'done', 'answer', ARGV[3])
else
  redis.call('HSET', KEYS[1], 'state', 'unknown')
end
return 1
