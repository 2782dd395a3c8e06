-- Store one profile section's vector, only while the row still holds the content it was made
-- from. KEYS: 1 the section's row, 2 the user's profile vectors, 3 the user's erasure marker.
-- ARGV: 1 memory_id, 2 the content_sha256 embedded, 3 the stored value (fingerprint:vector).
-- Answers 1 when stored, 0 when the row moved on (edited, deleted, redacted, retyped) or the
-- user is being erased: a vector of text that is no longer there never lands.
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local row = redis.call('HMGET', KEYS[1], 'memory_id', 'content_sha256', 'deleted', 'redacted',
                       'memory_type')
if row[1] ~= ARGV[1] or row[2] ~= ARGV[2] or row[3] == '1' or row[4] == '1'
    or row[5] ~= 'profile' then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
