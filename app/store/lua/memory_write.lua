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
-- Each effect of a write is its own include, tested alone (tests/test_memory_write_effects.py):
-- the row and its versions, the vector due list, the lexical recall index, the profile digest,
-- the keyed answer. This file composes them (commit, reply_of) and adds the namespace commands.
--#include version
--#include memory_digest
local NUL = string.char(0)
local STRUCTURED_WORKER = 'worker:structured_profile'
local TAIL = cjson.decode(A_tail)
-- The memory_id whose vector this write took out of the user's vector set: it leaves the
-- namespace's set too, as one of the namespace commands.
local VECTOR_LEFT = nil
-- Set when this write gave a user with no source fact their first: the structured passes are
-- woken in the namespace (a never-built user is built at the next tick, not after an idle wait).
local FIRST_SOURCE = false

--#include memory_write_row
--#include memory_write_vectors
--#include memory_write_lexical
--#include memory_write_digest
--#include memory_write_answer

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
  write_row(r, member, old_type)
  index_recall(r)
  local entry = source_entry(r, now)
  local valid_to = ''
  if entry then valid_to = r.valid_to or '' end
  return update_sources(K_sources, K_digest, K_source_expiry, r.memory_id, entry, valid_to, r.version)
end

-- The entries outside the user's slot that a write of r asserts, as commands: the memory_id's
-- pointer (a field of the namespace's pointer hash), the namespace's sets of users with facts
-- or sections, and its change lists when the sources moved (or a caller wrote the structured
-- worker's row). changed_at scores the change.
-- A command names its key by its declared name (app/store/script_interfaces.py
-- MEMORY_WRITE_NAMESPACE_KEYS): on one server that key is one of this script's KEYS and the
-- script writes it (reply_of); on Redis Cluster it is in another slot, so it is not, and the
-- caller resolves the name. No key name is built here.
local function namespace_commands(r, moved, changed_at, redacted)
  local t = TAIL
  local commands = {{'HSET', 'pointers', r.memory_id, t.pointer_value}}
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
        pointers = K_pointers,
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

