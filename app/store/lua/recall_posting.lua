-- A posting of the lexical recall index (keys.recall_postings). Layout 2: the term, byte 1,
-- the term's frequency in the row as 8 digits counting down (99999999 - tf), the row's length
-- as 8 digits, then the memory_id. A term's postings are one lex range, and inside it they
-- come by tf (highest first) and, for one tf, by length (shortest first). For any average
-- length BM25's term score falls along each tf's run, so a search reads a term's best postings
-- first and stops once nothing unread can reach its top (recall_search.lua).
-- Layout 1 (before) wrote term, byte 0, memory_id, byte 0, tf, byte 0, length, unordered by
-- score; a user's index is on layout 2 when its stats hash says layout = 2 (a user indexed
-- from empty, or rewritten by recall_relayout.lua).
local POSTING_MAX = 99999999
local LAYOUT = '2'

local function recall_posting(term, tf, len, mid)
  return term .. '\1' .. string.format('%08d%08d', POSTING_MAX - tf, math.min(len, POSTING_MAX))
    .. mid
end

local function recall_posting_v1(term, tf, len, mid)
  return term .. '\0' .. mid .. '\0' .. tf .. '\0' .. len
end

-- A row's postings in one layout (LAYOUT, or '1' for the first), appended to ``into``: its
-- (term, tf) pairs from recall_pairs, its length and its memory_id. ``with_scores`` puts the
-- score 0 before each, as ZADD takes them; without, they are ZREM's members.
local function recall_postings_into(into, found, len, mid, layout, with_scores)
  for _, p in ipairs(found) do
    if with_scores then into[#into + 1] = 0 end
    if layout == LAYOUT then
      into[#into + 1] = recall_posting(p[1], p[2], len, mid)
    else
      into[#into + 1] = recall_posting_v1(p[1], p[2], len, mid)
    end
  end
  return into
end

-- The (term, tf) pairs of a stored ``term:tf`` list, and the row's length (the sum of tf).
local function recall_pairs(stored)
  local found, len = {}, 0
  for term, tf in string.gmatch(stored, '([^ ]+):(%d+)') do
    tf = tonumber(tf)
    found[#found + 1] = {term, tf}
    len = len + tf
  end
  return found, len
end
