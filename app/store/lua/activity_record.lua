-- KEYS: 1 readers, 2 last op. ARGV: 1 now (us), 2 member, 3 op, 4 cutoff (us), 5 most readers.
-- Records one read and drops the readers past the window or past the cap, with their ops.
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4])
for _, member in ipairs(old) do redis.call('HDEL', KEYS[2], member) end
if #old > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[4]) end
local extra = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[5])
if extra > 0 then
  for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, extra - 1)) do
    redis.call('HDEL', KEYS[2], member)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, extra - 1)
end
return 1
