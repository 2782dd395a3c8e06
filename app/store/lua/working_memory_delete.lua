-- KEYS and ARGV: app/store/script_interfaces.py WORKING_MEMORY_DELETE. The index entry goes with the scope's last block, so
-- erasure lists only live scopes.
local removed = redis.call('HDEL', K_scope, A_block_key)
if redis.call('EXISTS', K_scope) == 0 then redis.call('SREM', K_index, K_scope) end
return removed
