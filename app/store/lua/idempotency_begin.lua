-- The key's record is a hash. A_recorded is '1' when the op's write keeps its answer in the
-- record in the same step (a lapsed lease then means the write never ran), '0' otherwise.
-- Answers {'NEW'} (reserved for this holder), {'DONE', answer}, {'RECORDED', the write
-- script's reply}, {'RUNNING', ms left of the lease}, {'UNKNOWN'} (the first try stopped
-- without an answer) or {'REUSED'} (another body).
local record = redis.call('HMGET', K_record, 'fingerprint', 'state', 'answer', 'reply',
                          'lease_until', 'started')
local now = tonumber(A_now_ms)
local function hold()
  redis.call('HSET', K_record, 'state', 'running', 'holder', A_holder,
             'lease_until', tostring(now + tonumber(A_lease_ms)))
end
if not record[1] then
  redis.call('HSET', K_record, 'fingerprint', A_fingerprint)
  hold()
  redis.call('PEXPIRE', K_record, A_life_ms)
  return {'NEW'}
end
if record[1] ~= A_fingerprint then return {'REUSED'} end
if record[2] == 'done' then
  if record[3] then return {'DONE', record[3]} end
  return {'RECORDED', record[4]}
end
if record[2] == 'running' then
  -- A record from before leases holds its start: it ran for a minute at most.
  local lease_until = tonumber(record[5] or '') or (tonumber(record[6] or '0') + 60000)
  if lease_until > now then return {'RUNNING', lease_until - now} end
  if A_recorded == '1' then
    -- The try that held the key is gone and its write kept no answer: it never ran.
    hold()
    return {'NEW'}
  end
end
return {'UNKNOWN'}
