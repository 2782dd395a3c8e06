-- KEYS: scope, index. ARGV: block_key. The index entry goes with the scope's last block, so
-- erasure lists only live scopes.
local removed = redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], KEYS[1]) end
return removed
