-- Records one read and drops the readers past the window or past the cap, with their ops.
redis.call('ZADD', K_readers, A_now_us, A_member)
redis.call('HSET', K_last_op, A_member, A_op)
local old = redis.call('ZRANGEBYSCORE', K_readers, '-inf', '(' .. A_cutoff_us)
for _, member in ipairs(old) do redis.call('HDEL', K_last_op, member) end
if #old > 0 then redis.call('ZREMRANGEBYSCORE', K_readers, '-inf', '(' .. A_cutoff_us) end
local extra = redis.call('ZCARD', K_readers) - tonumber(A_most_readers)
if extra > 0 then
  for _, member in ipairs(redis.call('ZRANGE', K_readers, 0, extra - 1)) do
    redis.call('HDEL', K_last_op, member)
  end
  redis.call('ZREMRANGEBYRANK', K_readers, 0, extra - 1)
end
return 1
