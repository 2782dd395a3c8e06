-- Store one profile section's vector, only while the row still holds the content it was made
-- from. KEYS: 1 the section's row, 2 the user's profile vectors, 3 the user's erasure marker,
-- 4 the user's section vector set.
-- ARGV: 1 memory_id, 2 the content_sha256 embedded, 3 the value for KEYS[2]
-- (fingerprint:vector, or the fingerprint alone when ARGV[4] is given), 4 on a server with
-- vector sets the unit vector as FP32 bytes for KEYS[4], else ''.
-- Answers 1 when stored, 0 when the row moved on (edited, deleted, redacted, retyped) or the
-- user is being erased: a vector of text that is no longer there never lands.
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local row = redis.call('HMGET', KEYS[1], 'memory_id', 'content_sha256', 'deleted', 'redacted',
                       'memory_type')
if row[1] ~= ARGV[1] or row[2] ~= ARGV[2] or row[3] == '1' or row[4] == '1'
    or row[5] ~= 'profile' then
  return 0
end
if ARGV[4] ~= '' then
  -- One length a set: a vector of another (the model changed) starts the set again.
  if redis.call('EXISTS', KEYS[4]) == 1
      and redis.call('VDIM', KEYS[4]) * 4 ~= string.len(ARGV[4]) then
    redis.call('DEL', KEYS[4])
  end
  redis.call('VADD', KEYS[4], 'FP32', ARGV[4], ARGV[1], 'NOQUANT')
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
