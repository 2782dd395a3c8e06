-- Set a user's queued-embeddings marker to the id of the job the caller is about to enqueue,
-- unless the user is being erased or the marker names a job already; with A_lost_job_id, take
-- over a marker that still names that job (the caller found it no longer waiting in its queue:
-- lost). Keys and arguments: app/store/script_interfaces.py RECALL_VECTOR_QUEUE.
-- Answers {1, ''} when it set the marker (the caller enqueues the job), else {0, the id held}.
if redis.call('EXISTS', K_erasing) == 1 then return {0, ''} end
if redis.call('SET', K_queued, A_job_id, 'NX', 'EX', A_ttl_seconds) then return {1, ''} end
local held = redis.call('GET', K_queued) or ''
if A_lost_job_id ~= '' and held == A_lost_job_id then
  redis.call('SET', K_queued, A_job_id, 'EX', A_ttl_seconds)
  return {1, ''}
end
return {0, held}
