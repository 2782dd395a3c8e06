-- The shared part of every memory write script. Its keys (K_row ... K_outcome) and the tail
-- argument (A_tail) are declared in app/store/script_interfaces.py MEMORY_WRITE_KEYS, which
-- every memory write script's declaration starts with; K_outcome is the Idempotency-Key
-- record the write's answer goes to, read only when the tail names a holder.
-- The tail (JSON, built by app/store/memory.py _tail): the names and values of the entries the
-- write asserts in the namespace's slot, whether the script writes them itself (one server) or
-- answers them for one pipeline (Redis Cluster, where no script over the user's slot reaches
-- them), the holder of the Idempotency-Key record the write's answer goes to ('' none), and the
-- id of the embeddings job the caller would enqueue ('' when embeddings are off or the caller
-- requests the job itself) with its marker's TTL.
--#include version
--#include memory_digest
--#include recall_posting
local SOURCE_TYPES = {semantic = true, preference = true, decision = true}
local NUL = string.char(0)
local STRUCTURED_WORKER = 'worker:structured_profile'
local TAIL = cjson.decode(A_tail)
local OUTCOME = nil
-- The memory_id whose vector this write took out of the user's vector set: it leaves the
-- namespace's set too, as one of the namespace commands.
local VECTOR_LEFT = nil
-- Set when this write gave a user with no source fact their first: the structured passes are
-- woken in the namespace (a never-built user is built at the next tick, not after an idle wait).
local FIRST_SOURCE = false
if TAIL.holder ~= '' then OUTCOME = K_outcome end

-- The section's three entries in the user's section index (keys.profile_sections).
local function section_members(key, agent, session_id)
  return {
    'l' .. NUL .. key .. NUL .. agent .. NUL .. session_id,
    'a' .. NUL .. agent .. NUL .. key .. NUL .. session_id,
    's' .. NUL .. session_id .. NUL .. key .. NUL .. agent,
  }
end

local function index_section(key, agent, session_id, renderable)
  local members = section_members(key, agent, session_id)
  if renderable then
    redis.call('ZADD', K_sections, 0, members[1], 0, members[2], 0, members[3])
  else
    redis.call('ZREM', K_sections, members[1], members[2], members[3])
  end
end

-- The row's entries in the user's live rows (keys.memory_live); old_type is the type it had
-- before this write (nil for a new row), whose entry goes when the type changes.
local function index_live(r, old_type, member)
  if old_type and old_type ~= r.memory_type then
    redis.call('ZREM', K_live, old_type .. NUL .. member)
  end
  if r.deleted == '1' then
    redis.call('ZREM', K_live, r.memory_type .. NUL .. member, NUL .. member)
  else
    redis.call('ZADD', K_live, 0, r.memory_type .. NUL .. member, 0, NUL .. member)
  end
end

-- A change to the user's vectors: a search process drops its decoded copy. The birth time
-- makes a generation of vectors written after an erasure never equal one from before it.
local function bump_vector_generation(key)
  local t = redis.call('TIME')
  redis.call('HSETNX', key, 'born', t[1] .. '.' .. t[2])
  redis.call('HINCRBY', key, 'n', 1)
end

-- The row's entries in the user's lexical recall index (keys.recall_*): its current terms
-- when it is a live, unredacted fact with terms, none otherwise. A write that leaves the terms
-- as they were (a lock, a pin) touches nothing but one HGET.
local function index_recall(r)
  local mid = r.memory_id
  local old = redis.call('HGET', K_recall_docs, mid)
  if old == false then old = nil end
  local new = r.recall_terms
  if new == '' or r.deleted == '1' or r.redacted == '1' or r.memory_type == 'profile' then
    new = nil
  end
  if old == new then return end
  -- The vector described the old text: it goes, and the row waits for the embeddings job.
  -- Where the vector set holds it, it leaves the set in the same step (the key exists only
  -- on a server with the engine, so no other server is sent VREM).
  if redis.call('HDEL', K_recall_vectors, mid) == 1 then
    bump_vector_generation(K_recall_vectors_generation)
    if redis.call('EXISTS', K_recall_vector_set) == 1 then
      redis.call('VREM', K_recall_vector_set, mid)
      VECTOR_LEFT = mid
    end
  end
  if new then
    redis.call('ZADD', K_recall_vectors_due, 0, mid)
  else
    redis.call('ZREM', K_recall_vectors_due, mid)
  end
  -- A user still on layout 1 (recall_posting.lua) may hold the old row's postings in either
  -- form; a user with no document starts on layout 2.
  local stats = redis.call('HMGET', K_recall_stats, 'docs', 'layout')
  local current = stats[2] == LAYOUT
  if not current and tonumber(stats[1] or '0') == 0 then
    redis.call('HSET', K_recall_stats, 'layout', LAYOUT)
    current = true
  end
  local docs, length = 0, 0
  if old then
    local found, len = recall_pairs(old)
    local members = recall_postings_into({}, found, len, mid, LAYOUT, false)
    if not current then recall_postings_into(members, found, len, mid, '1', false) end
    if #members > 0 then redis.call('ZREM', K_recall_postings, unpack(members)) end
    redis.call('HDEL', K_recall_docs, mid)
    docs, length = docs - 1, length - len
  end
  if new then
    local found, len = recall_pairs(new)
    local args = recall_postings_into({}, found, len, mid, LAYOUT, true)
    if #args > 0 then redis.call('ZADD', K_recall_postings, unpack(args)) end
    redis.call('HSET', K_recall_docs, mid, new)
    docs, length = docs + 1, length + len
  end
  if docs ~= 0 then redis.call('HINCRBY', K_recall_stats, 'docs', docs) end
  if length ~= 0 then redis.call('HINCRBY', K_recall_stats, 'length', length) end
end

local function load_row()
  local flat = redis.call('HGETALL', K_row)
  if #flat == 0 then return nil end
  local r = {}
  for i = 1, #flat, 2 do r[flat[i]] = flat[i + 1] end
  return r
end

local function flatten(r)
  local flat = {}
  for k, v in pairs(r) do
    flat[#flat + 1] = k
    flat[#flat + 1] = v
  end
  return flat
end

local function pad(v) return string.rep('0', 20 - #v) .. v end

-- The row's entry in the user's sources, or nil when it is not a source now.
local function source_entry(r, now)
  if r.deleted == '1' or r.redacted == '1' then return nil end
  if not SOURCE_TYPES[r.memory_type] then return nil end
  if r.label == 'high' or (r.duplicate_of or '') ~= '' or r.tag_excluded == '1' then
    return nil
  end
  if (r.valid_to or '') ~= '' and not dec_gt(r.valid_to, now) then return nil end
  -- Dated by when it became true, else by its last change (updated_at), which a recall or a
  -- backfill keeps: their versions leave the entry, and so the digest, as it was.
  local date = r.valid_at or ''
  if date == '' then date = r.updated_at or '' end
  if date == '' then date = r.version end
  return r.content_sha256 .. ':' .. r.confidence .. ':' .. date
end

-- Move one source's entry in (src, dig, exp); true when the digest moved. The expiry index
-- follows valid_to even when the entry stays (a valid_at-dated fact whose valid_to moved).
local function update_sources(src, dig, exp, mid, entry, valid_to, at)
  local expiry_moved
  if entry and valid_to ~= '' then
    redis.call('ZADD', exp, valid_to, mid)
    expiry_moved = true
  else
    expiry_moved = redis.call('ZREM', exp, mid) == 1
  end
  if expiry_moved then
    local first = redis.call('ZRANGE', exp, 0, 0, 'WITHSCORES')
    redis.call('HSET', dig, 'next_expiry', first[2] or '')
  end
  local old = redis.call('HGET', src, mid)
  if old == false then old = nil end
  if old == entry then return false end
  local d = redis.call('HMGET', dig, 'digest', 'count')
  local digest = d[1] or ZERO
  local count = tonumber(d[2] or '0')
  if old then
    digest = xor_hex(digest, redis.sha1hex(mid .. '|' .. old))
    count = count - 1
  end
  if entry then
    digest = xor_hex(digest, redis.sha1hex(mid .. '|' .. entry))
    if count == 0 then FIRST_SOURCE = true end
    count = count + 1
    redis.call('HSET', src, mid, entry)
  else
    redis.call('HDEL', src, mid)
  end
  redis.call('HSET', dig, 'digest', digest, 'count', tostring(count), 'changed_at', at)
  if old and not entry then redis.call('HSET', dig, 'removed_at', at) end
  return true
end

-- What wrote a version (memory.history shows it): the op's word, and for a revert or a
-- restore the version whose content it brought back ('' otherwise).
local function mark(r, change, from_version)
  r.change = change
  r.from_version = from_version or ''
end

-- Write r as the row's next version; returns whether the user's source digest moved.
-- old_type: the row's memory_type before the write (nil for a new row). keep_change: the
-- version is no change of the fact (a recall, a backfill), so updated_at, the row's last
-- change, stays where it was.
local function commit(r, now, member, old_type, keep_change)
  local last = r.version
  if last == '' then last = nil end
  r.version = next_version(last, now)
  if not keep_change or (r.updated_at or '') == '' then r.updated_at = r.version end
  if (r.created_at or '') == '' then r.created_at = r.version end
  redis.call('HSET', K_row, unpack(flatten(r)))
  local padded = pad(r.version)
  redis.call('HSET', K_versions, padded, cjson.encode(r))
  redis.call('ZADD', K_version_order, 0, padded)
  redis.call('ZADD', K_rows, 0, member)
  redis.call('HSET', K_memory_ids, r.memory_id, K_row)
  index_section(r.key, r.agent, r.session_id,
    r.memory_type == 'profile' and r.deleted ~= '1' and r.redacted ~= '1')
  index_live(r, old_type, member)
  index_recall(r)
  local entry = source_entry(r, now)
  local valid_to = ''
  if entry then valid_to = r.valid_to or '' end
  return update_sources(K_sources, K_digest, K_source_expiry, r.memory_id, entry, valid_to, r.version)
end

-- keys.escape: a memory_id as a component of a key name.
local function escape(component)
  return (string.gsub(component, '[%%{}/:]',
    function(c) return string.format('%%%02X', string.byte(c)) end))
end

-- The entries outside the user's slot that a write of r asserts, as commands: the memory_id's
-- pointer, the namespace's sets of users with facts or sections, and its change lists when the
-- sources moved (or a caller wrote the structured worker's row). changed_at scores the change.
-- A command names its key by its declared name (app/store/script_interfaces.py
-- MEMORY_WRITE_NAMESPACE_KEYS): on one server that key is one of this script's KEYS and the
-- script writes it (reply_of); on Redis Cluster it is in another slot, so it is not, and the
-- caller resolves the name. The pointer is the one key still named here: its name holds the
-- row's memory_id, which a write addressed by key learns only from the row (docs/decisions.md).
local function namespace_commands(r, moved, changed_at, redacted)
  local t = TAIL
  local commands = {{'SET', t.pointer .. escape(r.memory_id), t.pointer_value}}
  if r.memory_type == 'profile' then
    commands[#commands + 1] = {'SADD', 'profile_users', t.user_id}
    commands[#commands + 1] = {'SADD', 'label_users', t.user_id}
    commands[#commands + 1] = {'SADD', 'agent_users', t.user_id}
  else
    -- A namespace search fans out over these users (app/store/recall.py).
    commands[#commands + 1] = {'SADD', 'recall_users', t.user_id}
  end
  -- A caller's write, redact or delete of the worker's row makes it read as no profile
  -- (pending): the user is listed, or no scan would ever see the row moved.
  local by_caller = t.structured_row and (redacted or r.written_by ~= STRUCTURED_WORKER)
  if moved or by_caller then
    commands[#commands + 1] = {'ZADD', 'changed_users', changed_at, t.user_id}
  end
  if VECTOR_LEFT then
    -- A namespace search's one VSIM reads this set (app/store/recall_vectors.py).
    commands[#commands + 1] = {'VREM', 'namespace_vector_set', t.user_id .. NUL .. VECTOR_LEFT}
  end
  if moved then
    -- The consolidation fold's own change list and the namespaces it visits.
    commands[#commands + 1] = {'ZADD', 'fold_changed', changed_at, t.user_id}
    commands[#commands + 1] = {'SADD', 'fact_namespaces', t.namespace_json}
  end
  if FIRST_SOURCE then
    commands[#commands + 1] = {'HINCRBY', 'structured_wakes', t.wake_member, 1}
    commands[#commands + 1] = {'HINCRBY', 'structured_wakes', t.wakes_total, 1}
  end
  return commands
end

-- The embeddings job the caller enqueues after this write: the tail's job id when the write
-- left a live, unredacted fact, the user has rows due for a vector and no job of the user is
-- queued (the marker, in the user's slot, is set to that id in this step, NX); else ''. A
-- user's steady writes so cost no step beyond the script (app/store/recall_vectors.py).
local function embed_job_of(status, r)
  local job = TAIL.embed_job or ''
  if job == '' or status == 'NOOP' then return '' end
  if r.deleted == '1' or r.redacted == '1' or r.memory_type == 'profile' then return '' end
  if redis.call('EXISTS', K_erasing) == 1 or redis.call('ZCARD', K_recall_vectors_due) == 0 then return '' end
  if redis.call('SET', K_recall_vectors_queued, job, 'NX', 'EX', TAIL.embed_ttl) then return job end
  return ''
end

-- The reply: status, whether the digest moved, the namespace commands left to the caller
-- (none on one server, where the script has written them), the embeddings job the caller
-- enqueues ('' none), the row's fields but its recall terms (the index's copy, which no
-- caller reads back). A write that changed nothing (NOOP) asserts nothing. changed_at
-- defaults to the new version; redacted marks a redact.
local function reply_of(status, moved, r, changed_at, redacted)
  local left = {}
  if status ~= 'NOOP' then
    local commands = namespace_commands(r, moved, changed_at or r.version, redacted)
    if TAIL.apply then
      local named = {
        recall_users = K_recall_users, namespace_vector_set = K_namespace_vector_set,
        profile_users = K_profile_users, label_users = K_label_users,
        agent_users = K_agent_users, changed_users = K_changed_users,
        fold_changed = K_fold_changed, fact_namespaces = K_fact_namespaces,
        structured_wakes = K_structured_wakes,
      }
      for _, command in ipairs(commands) do
        command[2] = named[command[2]] or command[2]
        redis.call(unpack(command))
      end
    else
      left = commands
    end
  end
  local reply = {status, moved and '1' or '0', left, embed_job_of(status, r)}
  for k, v in pairs(r) do
    if k ~= 'recall_terms' then
      reply[#reply + 1] = k
      reply[#reply + 1] = v
    end
  end
  return reply
end

-- The reply, kept as the Idempotency-Key's answer in the same step when the write answers one
-- (without the commands left to the caller or the job to enqueue, which a repeat does not
-- run again, and without the row's text: an answer names the row, never holds what it says,
-- so no record keeps what a redact scrubs or outlives it).
local UNKEPT = {value = true, tags = true, source_trace = true, duplicate_of = true}
local function answered(reply)
  if OUTCOME then
    local kept = {reply[1], reply[2], {}, ''}
    for i = 5, #reply - 1, 2 do
      if not UNKEPT[reply[i]] then
        kept[#kept + 1] = reply[i]
        kept[#kept + 1] = reply[i + 1]
      end
    end
    redis.call('HSET', OUTCOME, 'state', 'done', 'reply', cjson.encode(kept))
  end
  return reply
end

local function done(status, moved, r)
  return answered(reply_of(status, moved, r))
end

local function target(expected_id)
  if redis.call('EXISTS', K_erasing) == 1 then return nil, {'ERASING'} end
  local r = load_row()
  if not r or (expected_id ~= '' and r.memory_id ~= expected_id) then
    return nil, {'MISSING'}
  end
  return r, nil
end

-- A write that answers an Idempotency-Key runs only while its try holds the key: a try whose
-- lease ran out and another try took over writes nothing (app/idempotency.py).
if OUTCOME then
  local held = redis.call('HMGET', OUTCOME, 'holder', 'state')
  if held[1] ~= TAIL.holder or held[2] ~= 'running' then return {'LEASE_LOST'} end
end
