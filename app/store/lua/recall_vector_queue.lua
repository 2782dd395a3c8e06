-- Set a user's queued-embeddings marker unless it is set or the user is being erased.
-- KEYS: 1 the marker, 2 the user's erasure marker. ARGV: 1 the marker's TTL in seconds.
-- Answers 1 when it set the marker (the caller enqueues the job), else 0.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 1 end
return 0
