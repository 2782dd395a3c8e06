-- BM25 over one user's lexical recall index. KEYS: 1 recall postings, 2 recall docs, 3 recall
-- stats. ARGV: 1 how many hits to answer, 2 k1, 3 b, 4 average document length, 5 'pruned' or
-- 'exhaustive', then per query term: the term and its idf (computed by the caller over every
-- slot the search reaches, so scores from several users compare). Answers flat (memory_id,
-- score, matched term numbers "1,3") best first, ties by memory_id.
--
-- 'pruned' answers exactly what 'exhaustive' does, reading far fewer postings (Fagin's
-- threshold algorithm over the layout of recall_posting.lua): each term's postings are read
-- best first, a row met for the first time is scored in full from its stored terms, and the
-- reading stops once the top's worst score beats the sum of every term's next unread posting,
-- the most any unread row can still score. A user still on layout 1 is scored exhaustively.
--#include recall_posting
local top = tonumber(ARGV[1])
local k1, b, avgdl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if avgdl <= 0 then avgdl = 1 end
local pruned = ARGV[5] == 'pruned' and redis.call('HGET', KEYS[3], 'layout') == LAYOUT
local terms, idfs = {}, {}
for i = 6, #ARGV, 2 do
  terms[#terms + 1] = ARGV[i]
  idfs[#idfs + 1] = tonumber(ARGV[i + 1])
end

-- The one formula both ways use, so a pruned score is bit for bit the exhaustive one.
local function bm25(idf, tf, len)
  return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl))
end

-- (tf, len, memory_id) of a layout 2 posting of a term of n bytes.
local function parse(posting, n)
  return POSTING_MAX - tonumber(string.sub(posting, n + 2, n + 9)),
    tonumber(string.sub(posting, n + 10, n + 17)), string.sub(posting, n + 18)
end

local function reply_of(order, score, matched)
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
end

if not pruned then
  local score, matched, order = {}, {}, {}
  local function add(n, mid, s)
    if score[mid] then
      score[mid] = score[mid] + s
      matched[mid] = matched[mid] .. ',' .. n
    else
      score[mid] = s
      matched[mid] = tostring(n)
      order[#order + 1] = mid
    end
  end
  for n, term in ipairs(terms) do
    local idf = idfs[n]
    for _, posting in ipairs(redis.call('ZRANGEBYLEX', KEYS[1], '[' .. term .. '\1',
                                        '[' .. term .. '\1\255')) do
      local tf, len, mid = parse(posting, #term)
      add(n, mid, bm25(idf, tf, len))
    end
    for _, posting in ipairs(redis.call('ZRANGEBYLEX', KEYS[1], '[' .. term .. '\0',
                                        '[' .. term .. '\0\255')) do
      local _, mid, tf, len = string.match(posting, '^(.-)%z(.-)%z(%d+)%z(%d+)$')
      add(n, mid, bm25(idf, tonumber(tf), tonumber(len)))
    end
  end
  return reply_of(order, score, matched)
end

-- A term's postings of one tf are a run read in pages; its head is the next unread one.
local PAGE_FIRST, PAGE_MAX = 16, 1024
local function head(run)
  if run.pos > #run.buf then
    if run.ended then return nil end
    local page = redis.call('ZRANGEBYLEX', KEYS[1], '(' .. run.last, '[' .. run.prefix .. '\255',
                            'LIMIT', 0, run.page)
    run.buf, run.pos = page, 1
    run.ended = #page < run.page
    run.page = math.min(run.page * 2, PAGE_MAX)
    if #page == 0 then return nil end
    run.last = page[#page]
  end
  return run.buf[run.pos]
end

-- Every tf run of every term, found by its first posting.
local runs = {}
for n, term in ipairs(terms) do
  runs[n] = {}
  local from, high = '[' .. term .. '\1', '[' .. term .. '\1\255'
  while true do
    local first = redis.call('ZRANGEBYLEX', KEYS[1], from, high, 'LIMIT', 0, 1)[1]
    if not first then break end
    local prefix = string.sub(first, 1, #term + 9)
    runs[n][#runs[n] + 1] = {prefix = prefix, buf = {first}, pos = 1, last = first,
                             page = PAGE_FIRST, ended = false}
    from = '(' .. prefix .. '\255'
  end
end

-- The kept rows: a min-heap on (score, then memory_id reversed), its root the worst kept.
local heap, score, matched = {}, {}, {}
local function worse(x, y)
  if score[x] ~= score[y] then return score[x] < score[y] end
  return x > y
end
local function sift_down(i)
  local size = #heap
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= size and worse(heap[l], heap[m]) then m = l end
    if r <= size and worse(heap[r], heap[m]) then m = r end
    if m == i then return end
    heap[i], heap[m] = heap[m], heap[i]
    i = m
  end
end
local function keep(mid)
  if #heap < top then
    heap[#heap + 1] = mid
    local i = #heap
    while i > 1 do
      local parent = math.floor(i / 2)
      if not worse(heap[i], heap[parent]) then break end
      heap[i], heap[parent] = heap[parent], heap[i]
      i = parent
    end
  elseif worse(heap[1], mid) then
    heap[1] = mid
    sift_down(1)
  end
end

-- A row's whole score, summed over the terms in their order as the exhaustive way sums.
local function score_row(mid, len)
  local stored = redis.call('HGET', KEYS[2], mid)
  if not stored then return end
  stored = ' ' .. stored
  local total, hit = nil, nil
  for n, term in ipairs(terms) do
    local _, at = string.find(stored, ' ' .. term .. ':', 1, true)
    if at then
      local s = bm25(idfs[n], tonumber(string.match(stored, '^%d+', at + 1)), len)
      if total then
        total, hit = total + s, hit .. ',' .. n
      else
        total, hit = s, tostring(n)
      end
    end
  end
  if total then
    score[mid], matched[mid] = total, hit
    keep(mid)
  end
end

local seen = {}
while true do
  -- Each term's best unread posting; their sum bounds every row not met yet.
  local bound, best, best_run, best_value = nil, nil, nil, -1
  for n, term in ipairs(terms) do
    local value = 0
    for _, run in ipairs(runs[n]) do
      local posting = head(run)
      if posting then
        local tf, len = parse(posting, #term)
        local s = bm25(idfs[n], tf, len)
        if s > value then value = s end
        if s > best_value then best, best_run, best_value = n, run, s end
      end
    end
    if bound then bound = bound + value else bound = value end
  end
  if not best then break end
  if #heap >= top and score[heap[1]] > bound then break end
  local posting = best_run.buf[best_run.pos]
  best_run.pos = best_run.pos + 1
  local _, len, mid = parse(posting, #terms[best])
  if not seen[mid] then
    seen[mid] = true
    score_row(mid, len)
  end
end
local order = {}
for i, mid in ipairs(heap) do order[i] = mid end
return reply_of(order, score, matched)
