-- BM25 over the lexical recall index of one or more users. Keys and arguments are declared in
-- app/store/script_interfaces.py (RECALL_SEARCH). KEYS, from K_user_indexes_from: per user, in
-- turn, its recall postings, recall docs and recall stats (one user a call on Redis Cluster,
-- where users live in different slots; every user in scope in one call on a single server),
-- A_users of them. A_top: how many hits to answer; A_k1, A_b; A_avgdl: the average document
-- length; A_mode: 'pruned' or 'exhaustive'; A_budget: the call's work budget; A_floor: the
-- floor ('' none: see below); A_term_count: how many query terms. From A_terms_from, per query
-- term: the term and its idf (computed by the caller over every slot the search reaches, so
-- scores from several users compare). With A_avgdl empty, the terms come alone and the script
-- sums the documents, lengths and each term's document frequency over its users itself (one
-- server, where every user is in this call: no round trip reads them first); a term no user
-- holds then keeps its number and matches nothing. After the terms, a continuation this script
-- answered before, if any.
--
-- Answers {hits, next, work}. hits: flat (user number, memory_id, score, matched term numbers
-- "1,3") best first, ties by memory_id, then user number. next: empty when the search is done;
-- else the weights (average length then each term's idf, '' while not summed yet) and the
-- state to pass back in the next call, whose hits the caller merges with these. work: what the
-- call did, in units of one command the script runs: a command is one, a posting read a sixth,
-- a row scored from its stored terms an eighth for each query term, a row kept a half (their
-- measured costs against a command's, so a unit is about the same time whatever the query).
--
-- A call stops at the first point where it can resume once its work passes A_budget, so no call
-- holds the server long whatever the query (a point is before a user's figures or scoring, or
-- before a posting of the threshold's reading: at most one user's whole read, at most ROOM
-- postings, or one page of a run, past the budget). The caller keeps the best hits of the calls
-- so far and passes the score of the worst of its full top as the floor: a row below it cannot
-- enter the top, and a reading that cannot beat it stops. A search that fits one budget, as a
-- normal one does, is one call, answered as before. What a call learnt goes on with the search,
-- so a resumed call redoes none of it: the summed figures, each run's place, and the rows the
-- threshold already scored that an unread posting may still name (a row met again is not
-- scored again: its score went to the caller's top, or could not enter it, the first time).
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
local top = tonumber(A_top)
-- Measured: at 100,000 facts over 101 users with a few postings each, reading each user whole
-- halves the script's time against the threshold; on Zipf-drawn facts (a common term in most
-- rows) it costs within a tenth of it, the lists read past a user's four tops being the waste.
local READ_WHOLE_TOPS = 4
local k1, b, avgdl = tonumber(A_k1), tonumber(A_b), tonumber(A_avgdl)
local prune = A_mode == 'pruned'
local budget = tonumber(A_budget)
local floor = tonumber(A_floor)
local count = tonumber(A_term_count)
local users = tonumber(A_users)
-- User u's three keys.
local function postings_key(u) return KEYS[K_user_indexes_from + 3 * u - 3] end
local function docs_key(u) return KEYS[K_user_indexes_from + 3 * u - 2] end
local function stats_key(u) return KEYS[K_user_indexes_from + 3 * u - 1] end

-- What the work counts, against one command the script runs (ZLEXCOUNT, an HGET, a range of a
-- posting or two: about 1.7 us each on a loaded 2-core machine), each step by its measured
-- cost against a command's: a posting read in a range a sixth (0.27 us), and half more where
-- it is parsed and summed into its row's score; a row scored from its stored terms its HGET
-- and a quarter a query term; a step of the threshold's reading a half and a sixteenth a
-- query term (the bound sums every term's best unread posting); a row kept two (its heap
-- steps, its sort and its place in the answer), one that cannot enter it an eighth; a row an
-- earlier call scored and this one is told of, an eighth.
local POSTING_WORK = 1 / 6
local SUMMED_WORK = 1 / 2
local TERM_WORK = 1 / 4
local STEP_WORK = 1 / 2 + count / 16
local KEEP_WORK = 2
local REFUSED_WORK = 1 / 8
local CARRIED_WORK = 1 / 8
-- A row scanned from its stored terms (scan, below): its parse, the terms it holds.
local SCANNED_WORK = 1
-- The most postings one user's whole read may take: half the budget (at two thirds of a unit a
-- posting read and summed, a third of it), so that read stays a step of the call, never the
-- call.
local ROOM = math.min(top * READ_WHOLE_TOPS, math.floor(budget / 2))
local terms, idfs = {}, {}
local at = A_terms_from
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
  work = work + 1 + #list * POSTING_WORK
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
-- 2): ``held[n]`` the count of term n's postings (nil where not counted), and, while the
-- user's postings of every term so far fit ROOM, ``lists[n]`` the postings themselves (one
-- read serves the document frequency and the scoring). ``whole`` says every term's list was
-- read; ``total`` the count of all; ``fits`` whether they all fit ROOM.
local read_of = {}
local function bounds(term) return '[' .. term .. '\0', '[' .. term .. '\1\255' end
-- The figures' read of user u: the counts, with the lists too while ``with_lists`` and they
-- fit. Kept for the scoring pass of the same call; the scoring pass of a call that did not sum
-- the figures reads it then.
local function figures_of(u, with_lists)
  local key = postings_key(u)
  local held, lists, room, total = {}, {}, ROOM, 0
  local whole = with_lists
  for n, term in ipairs(terms) do
    local low, high = bounds(term)
    if whole then
      local list = range(key, low, high, 'LIMIT', 0, room + 1)
      if #list <= room then
        held[n], lists[n], room = #list, list, room - #list
      else
        whole = false
      end
    end
    if not lists[n] then held[n] = command('ZLEXCOUNT', key, low, high) end
    total = total + held[n]
  end
  local read = {held = held, lists = lists, whole = whole, total = total, fits = total <= ROOM}
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
  -- The lists are read with the counts while the figures look like ending in this call (its
  -- first, within half its budget), whose scoring pass then reads them from here; past that,
  -- counts alone, so figures that go on in another call leave no list read for nothing.
  local with_lists = phase ~= 'D'
  for u = from, users do
    if work >= budget then
      -- Out of budget before user u's figures: the next call sums on from there.
      local next = {''}
      for n = 1, #terms do next[#next + 1] = '' end
      for _, v in ipairs({'D', u, exact(docs), exact(length)}) do next[#next + 1] = v end
      for n = 1, #terms do next[#next + 1] = df[n] end
      return {{}, next, work}
    end
    local stats = command('HMGET', stats_key(u), 'docs', 'length')
    docs = docs + (tonumber(stats[1]) or 0)
    length = length + (tonumber(stats[2]) or 0)
    with_lists = with_lists and work < budget / 2
    for n, held in ipairs(figures_of(u, with_lists).held) do df[n] = df[n] + held end
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
-- Whether a row of this score may enter the top: not below the floor (the caller's top's
-- worst), nor below the worst of a full top here (a tie is left to ``worse``). Asked before a
-- row is made, so a row that cannot enter costs a comparison, not its row.
local function may_enter(s)
  if floor and s < floor then return false end
  return #heap < top or s >= score[heap[1]]
end
local function keep(row)
  if not may_enter(score[row]) then
    work = work + REFUSED_WORK
    return
  end
  work = work + KEEP_WORK
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
-- the lists its read kept, else read whole (a term the user holds none of is not read).
local function score_all(u, read)
  local postings = postings_key(u)
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
    if not list and (read.held[n] or 1) > 0 then
      list = range(postings, bounds(term))
    end
    list = list or {}
    work = work + #list * SUMMED_WORK
    for _, posting in ipairs(list) do
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
    if may_enter(total[mid]) then
      local row = row_of(u, mid)
      score[row], matched[row] = total[mid], hit[mid]
      keep(row)
    else
      work = work + REFUSED_WORK
    end
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
  return {user = u, key = postings_key(u), prefix = string.sub(posting, 1, #terms[n] + 9),
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

-- The rows the threshold over the current group has scored ('user number NUL memory_id'): a
-- row is met again by each of its terms' postings, and scored once (its score went to the top,
-- or could not enter it, the first time). ``carried``: those an earlier call scored, in the
-- order they came; ``least_of``: for those this call scored, the least of their term scores.
local seen, carried, least_of = {}, {}, {}
-- The most scored rows a stopped call hands on (an eighth of a unit each to hand on and to read
-- back in, so at most half the budget, or 250 units under a budget of 1,000): past it, a row
-- met again is scored again, which costs time and changes no hit.
local CARRIED_MAX = math.max(budget * 2, 1000)

-- Out of budget: the hits so far, and what the next call starts from: user u of the pass over
-- the users (users + 1 once it is done), whether the threshold over the group of runs was
-- under way ('T'), the group was still being gathered ('A') or user u's rows were being
-- scanned ('H'), how many runs the group holds and each at its next unread posting; then, for
-- 'T', the rows the group's threshold scored that an unread posting may still name, or, for
-- 'H', the scan's cursor.
local function stop_before(u, how, group, cursor)
  local next = {exact(avgdl)}
  for n = 1, #terms do next[#next + 1] = exact(idfs[n]) end
  next[#next + 1] = 'S'
  next[#next + 1] = u
  next[#next + 1] = how
  local runs_at = #next + 1
  next[runs_at] = 0
  local runs, best_unread = 0, nil
  for n, term_runs in ipairs(group) do
    for _, run in ipairs(term_runs) do
      next[#next + 1] = run.user
      next[#next + 1] = n
      next[#next + 1] = run.buf[run.pos]
      runs = runs + 1
      if run.value and (not best_unread or run.value > best_unread) then
        best_unread = run.value
      end
    end
  end
  next[runs_at] = runs
  if how == 'H' then next[#next + 1] = cursor end
  if how == 'T' and best_unread then
    -- The rows handed on before, as they came, then this call's that an unread posting may
    -- still name: the least of their term scores is at most the best unread posting's.
    local room = CARRIED_MAX
    for _, where in ipairs(carried) do
      if room == 0 then break end
      next[#next + 1] = where
      room = room - 1
    end
    for where, least in pairs(least_of) do
      if room == 0 then break end
      if least <= best_unread then
        next[#next + 1] = where
        room = room - 1
      end
    end
    work = work + (CARRIED_MAX - room) * CARRIED_WORK
  end
  return {answer(), next, work}
end

-- A row's whole score, summed over the terms in their order as the exhaustive way sums; it
-- answers the least of its term scores (nil for a row gone). Scoring a row looks for every
-- term in its stored list.
local ROW_WORK = #terms * TERM_WORK
local function score_row(u, mid, len)
  local stored = command('HGET', docs_key(u), mid)
  work = work + ROW_WORK
  if not stored then return nil end
  stored = ' ' .. stored
  local total, hit, least = nil, nil, nil
  for n, term in ipairs(terms) do
    local _, at = string.find(stored, ' ' .. term .. ':', 1, true)
    if at then
      local s = bm25(idfs[n], tonumber(string.match(stored, '^%d+', at + 1)), len)
      if total then
        total, hit = total + s, hit .. ',' .. n
        if s < least then least = s end
      else
        total, hit, least = s, tostring(n), s
      end
    end
  end
  if total then
    local row = row_of(u, mid)
    score[row], matched[row] = total, hit
    keep(row)
  end
  return least
end

-- User u's rows scored from their stored terms, a page of its docs at a time (HSCAN from
-- ``cursor``), while the call's work is within its budget: the way for a user whose postings
-- are too many for one step of a call but few enough that reading them all costs less than
-- the threshold (READ_WHOLE_TOPS tops' worth). A row's length is the sum of its terms' tf, as
-- its postings carry it, and its score sums its terms in their order, as every way sums.
-- Answers nil once the scan is done, else the cursor to go on from. HSCAN may answer a row
-- twice: it is kept once.
local SCAN_PAGE = 100
local scanned = {}
local function scan(u, cursor)
  local wanted = {}
  for n, term in ipairs(terms) do wanted[term] = n end
  local docs = docs_key(u)
  while true do
    local reply = command('HSCAN', docs, cursor, 'COUNT', SCAN_PAGE)
    cursor = reply[2] and reply[1] or '0'
    local flat = reply[2] or {}
    work = work + (#flat / 2) * SCANNED_WORK
    for i = 1, #flat, 2 do
      local mid = flat[i]
      local where = u .. '\0' .. mid
      if not scanned[where] then
        scanned[where] = true
        local tfs, len = {}, 0
        for term, tf in string.gmatch(flat[i + 1], '([^ ]+):(%d+)') do
          tf = tonumber(tf)
          len = len + tf
          if wanted[term] then tfs[wanted[term]] = tf end
        end
        local total = nil
        for n = 1, #terms do
          local tf = tfs[n]
          if tf then
            local s = bm25(idfs[n], tf, len)
            if total then total = total + s else total = s end
          end
        end
        if total and may_enter(total) then
          local hit = {}
          for n = 1, #terms do
            if tfs[n] then hit[#hit + 1] = n end
          end
          local row = row_of(u, mid)
          score[row], matched[row] = total, table.concat(hit, ',')
          keep(row)
        elseif total then
          work = work + REFUSED_WORK
        end
      end
    end
    if cursor == '0' then return nil end
    if work >= budget then return cursor end
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
    work = work + STEP_WORK
    local _, len, mid = parse(posting, #terms[best])
    local where = run.user .. '\0' .. mid
    if not seen[where] then
      seen[where] = true
      least_of[where] = score_row(run.user, mid, len)
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
-- A group's threshold done: the next group's rows are others.
local function group_done()
  seen, carried, least_of = {}, {}, {}
  return no_runs(), 0
end
-- Whether user u holds any posting of term n, as far as its read tells (true where unknown).
local function holds(read, n)
  if read.held[n] then return read.held[n] > 0 end
  if read.lists[n] then return #read.lists[n] > 0 end
  return true
end
local group, grouped, from = no_runs(), 0, 1
if phase == 'S' then
  from = tonumber(ARGV[at + 1])
  local i = at + 4
  for _ = 1, tonumber(ARGV[at + 3]) do
    local u, n = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    group[n][#group[n] + 1] = run_at(u, n, ARGV[i + 2], PAGE_RESUMED)
    grouped = grouped + 1
    i = i + 3
  end
  local how = ARGV[at + 2]
  if how == 'T' then
    for j = i, #ARGV do
      seen[ARGV[j]] = true
      carried[#carried + 1] = ARGV[j]
    end
  end
  work = work + grouped + #carried * CARRIED_WORK
  if how == 'T' then
    if not threshold(group) then return stop_before(from, 'T', group) end
    group, grouped = group_done()
  elseif how == 'H' then
    local cursor = scan(from, ARGV[i])
    if cursor then return stop_before(from, 'H', group, cursor) end
    from = from + 1
  end
end
local went_on = false
for u = from, users do
  if went_on and work >= budget then return stop_before(u, 'A', group) end
  went_on = true
  -- The figures' read of this call, else read now (a user whose counts already said they
  -- overflow is read no further).
  local read = read_of[u]
  if not read or (not read.whole and read.fits) then read = figures_of(u, true) end
  local pruned = not read.whole and prune
    and command('HGET', stats_key(u), 'layout') == LAYOUT
  if not pruned then
    score_all(u, read)
  elseif read.total <= top * READ_WHOLE_TOPS
      and command('HLEN', docs_key(u)) * SCANNED_WORK
        <= read.total * (POSTING_WORK + SUMMED_WORK) then
    -- Postings a whole read would pay for, too many for one step: scanned instead where that
    -- costs no more (a long query's common terms, several postings a row).
    local cursor = scan(u, '0')
    if cursor then return stop_before(u, 'H', group, cursor) end
  else
    local key = postings_key(u)
    for n, term in ipairs(terms) do
      local from_posting, high = '[' .. term .. '\1', '[' .. term .. '\1\255'
      while holds(read, n) do
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
      group, grouped = group_done()
    end
  end
end
if grouped > 0 and not threshold(group) then return stop_before(users + 1, 'T', group) end
return {answer(), {}, work}
