-- A memory write's keyed answer (included by memory_write): the reply kept in the
-- Idempotency-Key's record in the write's own step, and the check that the try holds the key.
-- The Idempotency-Key record this write answers (nil: none).
local OUTCOME = nil
if TAIL.holder ~= '' then OUTCOME = K_outcome end

-- The reply, kept as the Idempotency-Key's answer in the same step when the write answers one
-- (without the commands left to the caller or the job to enqueue, which a repeat does not
-- run again, and without the row's text: an answer names the row, never holds what it says,
-- so no record keeps what a redact scrubs or outlives it).
local UNKEPT = {value = true, tags = true, source_trace = true, duplicate_of = true}
local function answered(reply)
  if OUTCOME then
    local kept = {reply[1], reply[2], {}, ''}
    for i = 5, #reply - 1, 2 do
      if not UNKEPT[reply[i]] then
        kept[#kept + 1] = reply[i]
        kept[#kept + 1] = reply[i + 1]
      end
    end
    redis.call('HSET', OUTCOME, 'state', 'done', 'reply', cjson.encode(kept))
  end
  return reply
end

-- A write that answers an Idempotency-Key runs only while its try holds the key: a try whose
-- lease ran out and another try took over writes nothing (app/idempotency.py).
if OUTCOME then
  local held = redis.call('HMGET', OUTCOME, 'holder', 'state')
  if held[1] ~= TAIL.holder or held[2] ~= 'running' then return {'LEASE_LOST'} end
end
