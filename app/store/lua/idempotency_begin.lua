-- KEYS: 1 the key's record (a hash). ARGV: 1 the request's fingerprint, 2 the holder,
-- 3 now in ms, 4 how long a first call may still be running (ms), 5 the record's life (ms).
-- Answers {'NEW'} (reserved for this holder), {'DONE', answer}, {'RUNNING', ms left},
-- {'UNKNOWN'} (the first call stopped without an answer) or {'REUSED'} (another body).
local record = redis.call('HMGET', KEYS[1], 'fingerprint', 'state', 'answer', 'started')
if not record[1] then
  redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'state', 'running',
             'holder', ARGV[2], 'started', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {'NEW'}
end
if record[1] ~= ARGV[1] then return {'REUSED'} end
if record[2] == 'done' then return {'DONE', record[3]} end
if record[2] == 'running' then
  local left = tonumber(record[4]) + tonumber(ARGV[4]) - tonumber(ARGV[3])
  if left > 0 then return {'RUNNING', left} end
end
return {'UNKNOWN'}
