-- Set a user's queued-embeddings marker to the id of the job the caller is about to enqueue,
-- unless the user is being erased or the marker names a job already; with ARGV[3], take over a
-- marker that still names that job (the caller found it no longer waiting in its queue: lost).
-- KEYS: 1 the marker, 2 the user's erasure marker.
-- ARGV: 1 the marker's TTL in seconds, 2 the new job's id, 3 (optional) the lost job's id.
-- Answers {1, ''} when it set the marker (the caller enqueues the job), else {0, the id held}.
if redis.call('EXISTS', KEYS[2]) == 1 then return {0, ''} end
if redis.call('SET', KEYS[1], ARGV[2], 'NX', 'EX', ARGV[1]) then return {1, ''} end
local held = redis.call('GET', KEYS[1]) or ''
if ARGV[3] ~= nil and ARGV[3] ~= '' and held == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[1])
  return {1, ''}
end
return {0, held}
