-- KEYS and ARGV: app/store/script_interfaces.py MEMORY_POINTER_MOVE. One pointer of the earlier
-- layout (a string key per memory_id) becomes its field of the namespace's pointer hash, in
-- one step, so a reader finds it in one of the two at every moment. Answers 1 when it moved.
local value = redis.call('GET', K_legacy_pointer)
if not value then return 0 end
redis.call('HSET', K_pointers, A_memory_id, value)
redis.call('DEL', K_legacy_pointer)
return 1
