-- KEYS: 1 the key's record (a hash). ARGV: 1 the request's fingerprint, 2 the holder,
-- 3 now in ms, 4 the lease a try holds the key for (ms), 5 the record's life (ms), 6 '1' when
-- the op's write keeps its answer in the record in the same step (a lapsed lease then means
-- the write never ran), '0' otherwise.
-- Answers {'NEW'} (reserved for this holder), {'DONE', answer}, {'RECORDED', the write
-- script's reply}, {'RUNNING', ms left of the lease}, {'UNKNOWN'} (the first try stopped
-- without an answer) or {'REUSED'} (another body).
local record = redis.call('HMGET', KEYS[1], 'fingerprint', 'state', 'answer', 'reply',
                          'lease_until', 'started')
local now = tonumber(ARGV[3])
local function hold()
  redis.call('HSET', KEYS[1], 'state', 'running', 'holder', ARGV[2],
             'lease_until', tostring(now + tonumber(ARGV[4])))
end
if not record[1] then
  redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1])
  hold()
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {'NEW'}
end
if record[1] ~= ARGV[1] then return {'REUSED'} end
if record[2] == 'done' then
  if record[3] then return {'DONE', record[3]} end
  return {'RECORDED', record[4]}
end
if record[2] == 'running' then
  -- A record from before leases holds its start: it ran for a minute at most.
  local lease_until = tonumber(record[5] or '') or (tonumber(record[6] or '0') + 60000)
  if lease_until > now then return {'RUNNING', lease_until - now} end
  if ARGV[6] == '1' then
    -- The try that held the key is gone and its write kept no answer: it never ran.
    hold()
    return {'NEW'}
  end
end
return {'UNKNOWN'}
