"""Lua shared by the stores' server-side scripts.

Versions are nanosecond integers near 1.8e18, past the 2^53 a Lua number holds exactly, so
scripts keep them as decimal strings and compare and increment them as such.
"""

from __future__ import annotations

# next_version(last, now): max(now, last + 1) on decimal strings without a sign.
VERSION_LUA = r"""
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
"""


# KEYS: 1 a sorted set of users scored by change time. ARGV: 1 user, 2 read-at score.
# Removes the user only when no change came after the read, so a newer change stays listed.
CLEAR_UNLESS_CHANGED_SINCE = r"""
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"""

# KEYS: 1 a lock or lease. ARGV: 1 the holder's value, 2 ttl ms. Only the holder extends it.
RENEW_IF_HELD = r"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: 1 a lock or lease. ARGV: 1 the holder's value. Only the holder releases it.
RELEASE_IF_HELD = r"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
"""
