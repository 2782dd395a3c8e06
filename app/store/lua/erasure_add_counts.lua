-- Adds counts of removals made outside the user's slot to the erasure marker.
-- KEYS: 1 the marker. ARGV: kind, n pairs. Without the marker (the erasure finished
-- elsewhere) nothing is counted.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 1, #ARGV, 2 do
  if tonumber(ARGV[i + 1]) > 0 then redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return 1
