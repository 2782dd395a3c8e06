-- The user's source digest, shared by the memory write scripts and the expiry script: 40 hex
-- digits, the XOR over the user's sources of sha1(memory_id|entry), so a write takes one entry
-- out and puts one in, in any order.
local ZERO = string.rep('0', 40)
local function xor_hex(a, b)
  local out = {}
  for i = 1, 40, 4 do
    local x = bit.bxor(tonumber(string.sub(a, i, i + 3), 16), tonumber(string.sub(b, i, i + 3), 16))
    out[#out + 1] = string.format('%04x', x)
  end
  return table.concat(out)
end
