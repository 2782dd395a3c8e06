-- Versions are nanosecond integers near 1.8e18, past the 2^53 a Lua number holds exactly, so
-- scripts keep them as decimal strings and compare and increment them as such.
-- next_version(last, now): max(now, last + 1) on decimal strings without a sign.
local function dec_gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local function dec_incr(s)
  local n = #s
  if n <= 9 then return tostring(tonumber(s) + 1) end
  local high = tonumber(string.sub(s, 1, n - 9))
  local low = tonumber(string.sub(s, n - 8)) + 1
  if low >= 1000000000 then
    low = 0
    high = high + 1
  end
  return string.format('%d%09d', high, low)
end
local function next_version(last, now)
  if not last or last == '' then return now end
  local candidate = dec_incr(last)
  if dec_gt(now, candidate) then return now end
  return candidate
end
