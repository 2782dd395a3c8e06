-- A write script made one step with an Idempotency-Key's answer (app/store/lua keyed_script):
-- the script's text replaces the body marker below, and its refusal words (which applied
-- nothing, so a retry may run it again) fill KEYED_REFUSALS.
-- The last key is the key's record and the last argument the try's holder, both taken off KEYS
-- and ARGV so the script sees its own. It runs only while that try holds the key, and keeps
-- its reply (but a refusal) in the record in the same step: a try cut anywhere leaves the
-- reply or nothing.
local KEYED_RECORD, KEYED_HOLDER = table.remove(KEYS), table.remove(ARGV)
local keyed_held = redis.call('HMGET', KEYED_RECORD, 'holder', 'state')
if keyed_held[1] ~= KEYED_HOLDER or keyed_held[2] ~= 'running' then return {'LEASE_LOST'} end
local KEYED_REFUSALS = {--[[keyed refusals]]}
local keyed_reply = (function()
--#keyed body
end)()
if not (type(keyed_reply) == 'table' and KEYED_REFUSALS[keyed_reply[1]]) then
  redis.call('HSET', KEYED_RECORD, 'state', 'done', 'reply', cjson.encode(keyed_reply))
end
return keyed_reply
