-- A build's record of what the worker's profile write was built from. Under a pass's fence it
-- is written only while the fence still holds the pass's token, so a pass that lost its lease
-- writes nothing more. KEYS[1] the user's build record, KEYS[2] the fence (both in the user's
-- slot; absent without a fence). ARGV[1] the fence token ('' for none), ARGV[2..] field/value
-- pairs of the record.
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then return {'FENCED'} end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return {'OK'}
