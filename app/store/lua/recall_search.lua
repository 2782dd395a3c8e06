-- BM25 over one user's lexical recall index. KEYS: 1 recall postings. ARGV: 1 how many hits
-- to answer, 2 k1, 3 b, 4 average document length, then per query term: the term and its idf
-- (computed by the caller over every slot the search reaches, so scores from several users
-- compare). Answers flat (memory_id, score, matched term numbers "1,3") best first.
local NUL = string.char(0)
local top = tonumber(ARGV[1])
local k1, b, avgdl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if avgdl <= 0 then avgdl = 1 end
local score, matched, order = {}, {}, {}
local n = 0
for i = 5, #ARGV, 2 do
  n = n + 1
  local term, idf = ARGV[i], tonumber(ARGV[i + 1])
  local low = '[' .. term .. NUL
  local high = '[' .. term .. NUL .. '\255'
  for _, posting in ipairs(redis.call('ZRANGEBYLEX', KEYS[1], low, high)) do
    local _, mid, tf, len = string.match(posting, '^(.-)%z(.-)%z(%d+)%z(%d+)$')
    tf, len = tonumber(tf), tonumber(len)
    local s = idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl))
    if score[mid] then
      score[mid] = score[mid] + s
      matched[mid] = matched[mid] .. ',' .. n
    else
      score[mid] = s
      matched[mid] = tostring(n)
      order[#order + 1] = mid
    end
  end
end
-- Ties keep a stable order (memory_id), so a page does not shuffle between calls.
table.sort(order, function(x, y)
  if score[x] ~= score[y] then return score[x] > score[y] end
  return x < y
end)
local reply = {}
for i = 1, math.min(top, #order) do
  local mid = order[i]
  reply[#reply + 1] = mid
  reply[#reply + 1] = string.format('%.17g', score[mid])
  reply[#reply + 1] = matched[mid]
end
return reply
