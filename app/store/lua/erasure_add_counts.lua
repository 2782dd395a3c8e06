-- Adds counts of removals made outside the user's slot to the erasure marker. Without the
-- marker (the erasure finished elsewhere) nothing is counted.
if redis.call('EXISTS', K_marker) == 0 then return 0 end
for i = A_counts_from, #ARGV, 2 do
  if tonumber(ARGV[i + 1]) > 0 then redis.call('HINCRBY', K_marker, ARGV[i], ARGV[i + 1]) end
end
return 1
