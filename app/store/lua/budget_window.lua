-- Shared by the budget scripts: the rolling window's bookkeeping, all keys in the org's slot.
-- A reservation is an entry "tokens TAB settled TAB namespace"; spent holds the sums of the
-- window's entries: 'calls' and 'tokens' for the org, 'calls:<ns>' and 'tokens:<ns>' per
-- namespace.

local function budget_parse(entry)
  local first = string.find(entry, '\t', 1, true)
  local second = string.find(entry, '\t', first + 1, true)
  return tonumber(string.sub(entry, 1, first - 1)), string.sub(entry, first + 1, second - 1),
    string.sub(entry, second + 1)
end

-- Add calls and tokens to the org's and the namespace's sums; a namespace's sum that reaches
-- zero is removed, so the hash holds only the namespaces the window still counts.
local function budget_add(spent, ns, calls, tokens)
  redis.call('HINCRBY', spent, 'calls', calls)
  redis.call('HINCRBY', spent, 'tokens', tokens)
  local ns_calls = redis.call('HINCRBY', spent, 'calls:' .. ns, calls)
  local ns_tokens = redis.call('HINCRBY', spent, 'tokens:' .. ns, tokens)
  if ns_calls <= 0 and ns_tokens <= 0 then
    redis.call('HDEL', spent, 'calls:' .. ns, 'tokens:' .. ns)
  end
end

-- Take the reservations older than the window out of the sums (each leaves exactly once).
local function budget_trim(window, reservations, spent, now_ms, window_ms)
  local cutoff = now_ms - window_ms
  local expired = redis.call('ZRANGEBYSCORE', window, '-inf', cutoff)
  for _, id in ipairs(expired) do
    local entry = redis.call('HGET', reservations, id)
    if entry then
      local tokens, _, ns = budget_parse(entry)
      budget_add(spent, ns, -1, -tokens)
      redis.call('HDEL', reservations, id)
    end
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', window, '-inf', cutoff)
  end
end

local function budget_number(raw)
  if raw == false or raw == nil then return 0 end
  return tonumber(raw) or 0
end

-- A cap as a number, or nil when there is none.
local function budget_cap(raw)
  if raw == false or raw == nil or raw == '' then return nil end
  return tonumber(raw)
end
