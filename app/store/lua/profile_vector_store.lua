-- Store one profile section's vector, only while the row still holds the content it was made
-- from. Keys and arguments: app/store/script_interfaces.py PROFILE_VECTOR_STORE. A_stored is
-- the value for K_profile_vectors (fingerprint:vector, or the fingerprint alone when A_vector
-- is given); A_vector, on a server with vector sets, the unit vector as FP32 bytes for
-- K_section_vector_set, else ''.
-- Answers 1 when stored, 0 when the row moved on (edited, deleted, redacted, retyped) or the
-- user is being erased: a vector of text that is no longer there never lands.
if redis.call('EXISTS', K_erasing) == 1 then return 0 end
local row = redis.call('HMGET', K_row, 'memory_id', 'content_sha256', 'deleted', 'redacted',
                       'memory_type')
if row[1] ~= A_memory_id or row[2] ~= A_content_sha256 or row[3] == '1' or row[4] == '1'
    or row[5] ~= 'profile' then
  return 0
end
if A_vector ~= '' then
  -- One length a set: a vector of another (the model changed) starts the set again.
  if redis.call('EXISTS', K_section_vector_set) == 1
      and redis.call('VDIM', K_section_vector_set) * 4 ~= string.len(A_vector) then
    redis.call('DEL', K_section_vector_set)
  end
  redis.call('VADD', K_section_vector_set, 'FP32', A_vector, A_memory_id, 'NOQUANT')
end
redis.call('HSET', K_profile_vectors, A_memory_id, A_stored)
return 1
