-- BM25 over the lexical recall index of one or more users. KEYS: per user, in turn, its recall
-- postings, recall docs and recall stats (one user a call on Redis Cluster, where users live in
-- different slots; every user in scope in one call on a single server). ARGV: 1 how many hits
-- to answer, 2 k1, 3 b, 4 average document length, 5 'pruned' or 'exhaustive', 6 the call's
-- work budget, 7 the floor ('' none: see below), 8 how many query terms, then per query term:
-- the term and its idf (computed by the caller over every slot the search reaches, so scores
-- from several users compare). With ARGV 4 empty, the terms come alone and the script sums the
-- documents, lengths and each term's document frequency over its users itself (one server,
-- where every user is in this call: no round trip reads them first); a term no user holds then
-- keeps its number and matches nothing. After the terms, a continuation this script answered
-- before, if any.
--
-- Answers {hits, next, work}. hits: flat (user number, memory_id, score, matched term numbers
-- "1,3") best first, ties by memory_id, then user number. next: empty when the search is done;
-- else the weights (average length then each term's idf, '' while not summed yet) and the
-- state to pass back in the next call, whose hits the caller merges with these. work: what the
-- call did, postings read plus commands run plus, for a row scored from its stored terms, one
-- for each four query terms, plus two for each row kept.
--
-- A call stops at the first point where it can resume once its work passes ARGV 6, so no call
-- holds the server long whatever the query (a point is before a user's figures or scoring, or
-- before a posting of the threshold's reading: at most one user's whole read, at most ROOM
-- postings, or one page of a run, past the budget). The caller keeps the best hits of the calls
-- so far and passes the score of the worst of its full top as the floor: a row below it cannot
-- enter the top, and a reading that cannot beat it stops. A search that fits one budget, as a
-- normal one does, is one call, answered as before.
--
-- 'pruned' answers exactly what 'exhaustive' does, reading far fewer postings (Fagin's
-- threshold algorithm over the layout of recall_posting.lua): the best unread posting over
-- every term's runs is read next, a row met for the first time is scored in full from its
-- stored terms, and the reading stops once the top's worst score beats the sum of every term's
-- best unread posting, the most any row not met yet can score. A user still on layout 1, or
-- holding no more than READ_WHOLE_TOPS tops' worth of the query's postings, is scored
-- exhaustively into the same top first: reading a posting costs less than scoring a row met by
-- one, so the threshold pays only where it can leave most postings unread, and the rows found
-- so raise the top's floor before it starts.
--#include recall_posting
local top = tonumber(ARGV[1])
-- Measured: at 100,000 facts over 101 users with a few postings each, reading each user whole
-- halves the script's time against the threshold; on Zipf-drawn facts (a common term in most
-- rows) it costs within a tenth of it, the lists read past a user's four tops being the waste.
local READ_WHOLE_TOPS = 4
local k1, b, avgdl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local prune = ARGV[5] == 'pruned'
local budget = tonumber(ARGV[6])
local floor = tonumber(ARGV[7])
local count = tonumber(ARGV[8])
-- The most postings one user's whole read may take: a quarter of the budget, so that read
-- stays a step of the call, never the call.
local ROOM = math.min(top * READ_WHOLE_TOPS, math.floor(budget / 4))
local users = #KEYS / 3
local terms, idfs = {}, {}
local at = 9
if avgdl then
  for n = 1, count do
    terms[n], idfs[n] = ARGV[at], tonumber(ARGV[at + 1])
    at = at + 2
  end
else
  for n = 1, count do
    terms[n] = ARGV[at]
    at = at + 1
  end
end
local phase = ARGV[at]

local work = 0
local function range(...)
  local list = redis.call('ZRANGEBYLEX', ...)
  work = work + 1 + #list
  return list
end
local function command(...)
  work = work + 1
  return redis.call(...)
end
local function exact(x)
  return string.format('%.17g', x)
end

-- What user u holds of each term, both layouts (term NUL ... is layout 1, term SOH ... layout
-- 2), read once for the document frequencies and for the choice of how the user is scored:
-- ``held[n]`` the count of term n's postings, and, while the user's postings of every term so
-- far fit ROOM, ``lists[n]`` the postings themselves (one read serves both). ``whole`` says
-- every term's list was read.
local read_of = {}
local function postings_of(u)
  local read = read_of[u]
  if read then return read end
  local key = KEYS[3 * u - 2]
  local held, lists, room = {}, {}, ROOM
  local whole = true
  for n, term in ipairs(terms) do
    local low, high = '[' .. term .. '\0', '[' .. term .. '\1\255'
    if whole then
      local list = range(key, low, high, 'LIMIT', 0, room + 1)
      if #list <= room then
        held[n], lists[n], room = #list, list, room - #list
      else
        whole = false
      end
    end
    if not lists[n] then held[n] = command('ZLEXCOUNT', key, low, high) end
  end
  read = {held = held, lists = lists, whole = whole}
  read_of[u] = read
  return read
end
if not avgdl then
  local docs, length, df, from = 0, 0, {}, 1
  for n = 1, #terms do df[n] = 0 end
  if phase == 'D' then
    from, docs, length = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
    for n = 1, #terms do df[n] = tonumber(ARGV[at + 3 + n]) end
  end
  for u = from, users do
    if work >= budget then
      -- Out of budget before user u's figures: the next call sums on from there.
      local next = {''}
      for n = 1, #terms do next[#next + 1] = '' end
      for _, v in ipairs({'D', u, exact(docs), exact(length)}) do next[#next + 1] = v end
      for n = 1, #terms do next[#next + 1] = df[n] end
      return {{}, next, work}
    end
    local stats = command('HMGET', KEYS[3 * u], 'docs', 'length')
    docs = docs + (tonumber(stats[1]) or 0)
    length = length + (tonumber(stats[2]) or 0)
    for n, held in ipairs(postings_of(u).held) do df[n] = df[n] + held end
  end
  if docs <= 0 then return {{}, {}, work} end
  local any = false
  for n = 1, #terms do
    -- BM25's idf as Lucene and bm25s take it (never negative), as the caller computes it.
    if df[n] > 0 then
      idfs[n], any = math.log(1 + (docs - df[n] + 0.5) / (df[n] + 0.5)), true
    else
      idfs[n] = 0
    end
  end
  if not any then return {{}, {}, work} end
  avgdl = length / docs
  phase = nil
end
if avgdl <= 0 then avgdl = 1 end

-- The one formula both ways use, so a pruned score is bit for bit the exhaustive one.
local function bm25(idf, tf, len)
  return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl))
end

-- (tf, len, memory_id) of a layout 2 posting of a term of n bytes.
local function parse(posting, n)
  return POSTING_MAX - tonumber(string.sub(posting, n + 2, n + 9)),
    tonumber(string.sub(posting, n + 10, n + 17)), string.sub(posting, n + 18)
end

-- The kept rows, each 'user number NUL memory_id': a min-heap, its root the worst kept.
local heap, score, matched, mid_of, user_of = {}, {}, {}, {}, {}
local function worse(x, y)
  if score[x] ~= score[y] then return score[x] < score[y] end
  if mid_of[x] ~= mid_of[y] then return mid_of[x] > mid_of[y] end
  return user_of[x] > user_of[y]
end
local function keep(row)
  -- A row below the floor cannot enter the caller's top, whose worst is the floor.
  if floor and score[row] < floor then return end
  -- A kept row costs its heap steps now and its sort and its place in the answer at the end.
  work = work + 2
  if #heap < top then
    heap[#heap + 1] = row
    local i = #heap
    while i > 1 do
      local parent = math.floor(i / 2)
      if not worse(heap[i], heap[parent]) then break end
      heap[i], heap[parent] = heap[parent], heap[i]
      i = parent
    end
  elseif worse(heap[1], row) then
    heap[1] = row
    local i, size = 1, #heap
    while true do
      local l, r, m = 2 * i, 2 * i + 1, i
      if l <= size and worse(heap[l], heap[m]) then m = l end
      if r <= size and worse(heap[r], heap[m]) then m = r end
      if m == i then break end
      heap[i], heap[m] = heap[m], heap[i]
      i = m
    end
  end
end
local function row_of(u, mid)
  local row = u .. '\0' .. mid
  mid_of[row], user_of[row] = mid, u
  return row
end

-- Every posting of every term of user u, summed per row over the terms in their order: from
-- the lists postings_of kept, else read whole (a term the user holds none of is not read).
local function score_all(u, read)
  local postings = KEYS[3 * u - 2]
  local rows, total, hit = {}, {}, {}
  local function add(n, mid, s)
    if total[mid] then
      total[mid], hit[mid] = total[mid] + s, hit[mid] .. ',' .. n
    else
      total[mid], hit[mid] = s, tostring(n)
      rows[#rows + 1] = mid
    end
  end
  for n, term in ipairs(terms) do
    local idf = idfs[n]
    local list = read.lists[n]
    if not list and read.held[n] > 0 then
      list = range(postings, '[' .. term .. '\0', '[' .. term .. '\1\255')
    end
    for _, posting in ipairs(list or {}) do
      if string.byte(posting, #term + 1) == 1 then
        local tf, len, mid = parse(posting, #term)
        add(n, mid, bm25(idf, tf, len))
      else
        local _, mid, tf, len = string.match(posting, '^(.-)%z(.-)%z(%d+)%z(%d+)$')
        add(n, mid, bm25(idf, tonumber(tf), tonumber(len)))
      end
    end
  end
  for _, mid in ipairs(rows) do
    local row = row_of(u, mid)
    score[row], matched[row] = total[mid], hit[mid]
    keep(row)
  end
end

-- A term's postings of one tf in one user are a run, read in pages; its head is the next
-- unread one.
local PAGE_FIRST, PAGE_MAX = 16, 1024
local function head(run)
  if run.pos > #run.buf then
    if run.ended then return nil end
    local page = range(run.key, '(' .. run.last, '[' .. run.prefix .. '\255', 'LIMIT', 0,
                       run.page)
    run.buf, run.pos = page, 1
    run.ended = #page < run.page
    -- Pages grow, but never past a user's whole read: one stays a step of the call.
    run.page = math.max(PAGE_FIRST, math.min(run.page * 2, PAGE_MAX, ROOM))
    if #page == 0 then return nil end
    run.last = page[#page]
  end
  return run.buf[run.pos]
end

-- A run at a posting: its first, or its next unread one where an earlier call of this search
-- stopped (read on from there in pages from PAGE_RESUMED: the page read before is gone, and
-- most runs left are read no further).
local PAGE_RESUMED = 2
local function run_at(u, n, posting, page)
  return {user = u, key = KEYS[3 * u - 2], prefix = string.sub(posting, 1, #terms[n] + 9),
          buf = {posting}, pos = 1, last = posting, page = page, ended = false}
end

-- The hits kept so far, best first, flat.
local function answer()
  table.sort(heap, function(x, y) return worse(y, x) end)
  local reply = {}
  for _, row in ipairs(heap) do
    reply[#reply + 1] = user_of[row]
    reply[#reply + 1] = mid_of[row]
    reply[#reply + 1] = exact(score[row])
    reply[#reply + 1] = matched[row]
  end
  return reply
end

-- Out of budget: the hits so far, and what the next call starts from: user u of the pass over
-- the users (users + 1 once it is done), whether the threshold over the group of runs was
-- under way ('T') or the group was still being gathered ('A'), and each of the group's runs
-- at its next unread posting.
local function stop_before(u, how, group)
  local next = {exact(avgdl)}
  for n = 1, #terms do next[#next + 1] = exact(idfs[n]) end
  next[#next + 1] = 'S'
  next[#next + 1] = u
  next[#next + 1] = how
  for n, runs in ipairs(group) do
    for _, run in ipairs(runs) do
      next[#next + 1] = run.user
      next[#next + 1] = n
      next[#next + 1] = run.buf[run.pos]
    end
  end
  return {answer(), next, work}
end

-- A row's whole score, summed over the terms in their order as the exhaustive way sums.
-- Scoring a row looks for every term in its stored list: a unit of work for each four terms
-- besides its read.
local ROW_WORK = math.ceil(#terms / 4)
local function score_row(u, mid, len)
  local stored = command('HGET', KEYS[3 * u - 1], mid)
  work = work + ROW_WORK
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
    local row = row_of(u, mid)
    score[row], matched[row] = total, hit
    keep(row)
  end
end

-- Each term's runs in a max-heap on the score of their head, so the next posting and the bound
-- cost a heap step, not a look at every run of every user.
local function sift(h, i)
  local size = #h
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= size and h[l].value > h[m].value then m = l end
    if r <= size and h[r].value > h[m].value then m = r end
    if m == i then return end
    h[i], h[m] = h[m], h[i]
    i = m
  end
end
local function value_of(run, n)
  local posting = head(run)
  if not posting then return nil end
  local tf, len = parse(posting, #terms[n])
  return bm25(idfs[n], tf, len)
end
-- The threshold's reading over a group of runs (``group[n]`` term n's): true once no unread
-- posting of theirs can change the top, false when the budget ran out first, after at least
-- one posting (each of the group's lists is then its term's runs left, at their heads).
local seen = {}
local function threshold(group)
  local heads = {}
  for n = 1, #terms do
    local h = {}
    for _, run in ipairs(group[n]) do
      run.value = value_of(run, n)
      if run.value then h[#h + 1] = run end
    end
    for i = math.floor(#h / 2), 1, -1 do sift(h, i) end
    heads[n] = h
    group[n] = h
  end
  local read_one = false
  while true do
    -- Each term's best unread posting; their sum bounds every row not met yet.
    local bound, best, best_value = nil, nil, -1
    for n = 1, #terms do
      local first = heads[n][1]
      local value = first and first.value or 0
      if first and value > best_value then best, best_value = n, value end
      if bound then bound = bound + value else bound = value end
    end
    if not best then return true end
    if #heap >= top and score[heap[1]] > bound then return true end
    if floor and floor > bound then return true end
    if read_one and work >= budget then return false end
    local h = heads[best]
    local run = h[1]
    local posting = run.buf[run.pos]
    run.pos = run.pos + 1
    run.value = value_of(run, best)
    if not run.value then
      h[1] = h[#h]
      h[#h] = nil
    end
    if #h > 0 then sift(h, 1) end
    read_one = true
    local _, len, mid = parse(posting, #terms[best])
    local where = run.user .. '\0' .. mid
    if not seen[where] then
      seen[where] = true
      score_row(run.user, mid, len)
    end
  end
end

-- The users in turn: one read whole (or on layout 1, or every posting scored) is scored into
-- the top at once; a pruned one's tf runs of every term, found by their first postings, join
-- a group, read by the threshold once the pass ends or the group holds RUNS_MAX runs (a
-- normal search's runs are one group: every pruned user under one bound). A group is what a
-- call that stops hands on, so it stays a few hundred runs whatever the scope.
local RUNS_MAX = math.max(8, math.floor(budget / 8))
local function no_runs()
  local group = {}
  for n = 1, #terms do group[n] = {} end
  return group
end
local group, grouped, from = no_runs(), 0, 1
if phase == 'S' then
  from = tonumber(ARGV[at + 1])
  for i = at + 3, #ARGV, 3 do
    local u, n = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    group[n][#group[n] + 1] = run_at(u, n, ARGV[i + 2], PAGE_RESUMED)
    grouped = grouped + 1
  end
  work = work + grouped
  if ARGV[at + 2] == 'T' then
    if not threshold(group) then return stop_before(from, 'T', group) end
    group, grouped = no_runs(), 0
  end
end
local went_on = false
for u = from, users do
  if went_on and work >= budget then return stop_before(u, 'A', group) end
  went_on = true
  local read = postings_of(u)
  local held = read.held
  if read.whole or not prune or command('HGET', KEYS[3 * u], 'layout') ~= LAYOUT then
    score_all(u, read)
  else
    local key = KEYS[3 * u - 2]
    for n, term in ipairs(terms) do
      local from_posting, high = '[' .. term .. '\1', '[' .. term .. '\1\255'
      while held[n] > 0 do
        local first = range(key, from_posting, high, 'LIMIT', 0, 1)[1]
        if not first then break end
        local run = run_at(u, n, first, PAGE_FIRST)
        group[n][#group[n] + 1] = run
        grouped = grouped + 1
        from_posting = '(' .. run.prefix .. '\255'
      end
    end
    if grouped >= RUNS_MAX then
      if not threshold(group) then return stop_before(u + 1, 'T', group) end
      group, grouped = no_runs(), 0
    end
  end
end
if grouped > 0 and not threshold(group) then return stop_before(users + 1, 'T', group) end
return {answer(), {}, work}
