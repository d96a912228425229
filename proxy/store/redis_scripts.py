"""The Lua scripts of the Redis fact log (``proxy.store.redis``): each one atomic step on one session's keys.

Redis runs a script without interleaving any other command, and every key a
script touches is passed in ``KEYS`` and shares the session's hash tag, so each
script runs on Redis Cluster too, on the node of that session's slot.
"""

from proxy.store.base import OPENINGS_KEPT

# KEYS: log, meta, fact keys. ARGV: expected_seq, ts, tenant, session, messages, checkpoints, tail ('' for none),
# then per fact its key ('' for none) and its body.
# Returns {"ok", id...}; {"conflict", actual_next_seq}; {"diverged", actual_next_seq} when the last entry is not the
# one the writer names by ``tail``; or {"known", position, id, body, ...} for the facts (1-based positions) whose key
# is already logged, and then writes nothing.
APPEND_LUA = """
local expected = tonumber(ARGV[1])
local actual = tonumber(redis.call('HGET', KEYS[2], 'next_seq') or '0')
if actual ~= expected then
  return {'conflict', actual}
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local tail = last[1] and last[1][1] or '0-0'
if tail ~= string.format('%d-0', expected) then
  return redis.error_reply('ctxproxy: ' .. KEYS[1] .. ' ends at ' .. tail .. ' but meta says next_seq ' .. expected)
end
if ARGV[7] ~= '' and (last[1] == nil or redis.sha1hex(last[1][2][2]) ~= ARGV[7]) then
  return {'diverged', actual}
end
local n = (#ARGV - 7) / 2
local known = {'known'}
for i = 1, n do
  local fact_key = ARGV[6 + 2 * i]
  if fact_key ~= '' then
    local seq = redis.call('HGET', KEYS[3], fact_key)
    if seq then
      local id = string.format('%d-0', tonumber(seq) + 1)
      local entry = redis.call('XRANGE', KEYS[1], id, id)
      if entry[1] == nil then
        return redis.error_reply('ctxproxy: ' .. KEYS[3] .. ' names entry ' .. id .. ', which the log lacks')
      end
      known[#known + 1] = i
      known[#known + 1] = id
      known[#known + 1] = entry[1][2][2]
    end
  end
end
if #known > 1 then
  return known
end
if n == 0 then
  return {'ok'}
end
local ids = {'ok'}
for i = 1, n do
  ids[i + 1] = redis.call('XADD', KEYS[1], string.format('%d-0', expected + i), 'f', ARGV[7 + 2 * i])
  if ARGV[6 + 2 * i] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[6 + 2 * i], string.format('%d', expected + i - 1))
  end
end
redis.call('HSET', KEYS[2], 'next_seq', string.format('%d', expected + n), 'updated_at', ARGV[2],
  'tenant', ARGV[3], 'session', ARGV[4])
redis.call('HINCRBY', KEYS[2], 'messages', ARGV[5])
redis.call('HINCRBY', KEYS[2], 'checkpoints', ARGV[6])
return ids
"""

# Take the lock if free, or renew it if the caller already holds it.
LOCK_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# Delete only our own lock: one that expired and was retaken belongs to someone else.
UNLOCK_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# Noting a tenant of a session id: its set scored by when each was last noted, a prober's score lowered by
# PROBER_OFFSET so owners always rank first and a trim drops probers first (ZADD GT: a later call moves it up, never
# an owner down), and a hash of each one's conversation openings, newest first, space-separated, at most
# OPENINGS_KEPT.
_NOTE = """
local PROBER_OFFSET = 1e12
local OPENINGS_KEPT = """ + str(OPENINGS_KEPT) + """
local function note(tenants, openings, ts, tenant, kept, opening, owner)
  local score = tonumber(ts)
  if owner == 0 then
    score = score - PROBER_OFFSET
  end
  redis.call('ZADD', tenants, 'GT', score, tenant)
  if opening ~= '' then
    local list = {opening}
    for known in string.gmatch(redis.call('HGET', openings, tenant) or '', '%S+') do
      if known ~= opening and #list < OPENINGS_KEPT then
        list[#list + 1] = known
      end
    end
    redis.call('HSET', openings, tenant, table.concat(list, ' '))
  end
  for _, name in ipairs(redis.call('ZRANGE', tenants, 0, -(kept + 1))) do
    redis.call('ZREM', tenants, name)
    redis.call('HDEL', openings, name)
  end
end
"""

# Note a tenant (``FactLog.note_tenant``). KEYS: the session id's set, its openings. ARGV: ts, tenant, kept, opening,
# owner (1 or 0).
NOTE_TENANT_LUA = _NOTE + """
note(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]))
return 1
"""

# The tenants of a session id other than ``tenant``, owners first, newest first, at most ``kept``, flat as
# {name, opening, name, opening...}; then ``tenant`` is noted: an owner when there were none, else a prober.
_OTHERS_NOTING = _NOTE + """
local function others_noting(tenants, openings, ts, tenant, kept, opening)
  local others = {}
  for _, name in ipairs(redis.call('ZREVRANGE', tenants, 0, kept - 1)) do
    if name ~= tenant then
      others[#others + 1] = name
      others[#others + 1] = redis.call('HGET', openings, name) or ''
    end
  end
  note(tenants, openings, ts, tenant, kept, opening, #others == 0 and 1 or 0)
  return others
end
"""

# A session's link (false: none), then the first ``limit`` entries of its log.
_READ_LINKED = """
local function read_linked(log, link, limit)
  local out = {redis.call('GET', link)}
  for _, entry in ipairs(redis.call('XRANGE', log, '-', '+', 'COUNT', limit)) do
    out[#out + 1] = entry
  end
  return out
end
"""

# ``FactLog.first_look`` in one script: {link, others, entry...}. KEYS: the log, the link, the session id's set of
# tenants, its openings. ARGV: limit, ts, tenant, kept, opening. Only where one script may touch keys of two slots
# (not on a cluster).
FIRST_LOOK_LUA = _OTHERS_NOTING + _READ_LINKED + """
local out = read_linked(KEYS[1], KEYS[2], tonumber(ARGV[1]))
table.insert(out, 2, others_noting(KEYS[3], KEYS[4], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]))
return out
"""
# The same on a cluster, as two scripts: the log's slot {link, entry...} (KEYS: the log, the link; ARGV: limit),
# and the tenants' slot (KEYS: the set, its openings; ARGV: ts, tenant, kept, opening).
READ_LINKED_LUA = _READ_LINKED + "return read_linked(KEYS[1], KEYS[2], tonumber(ARGV[1]))"
OTHERS_NOTING_LUA = _OTHERS_NOTING + (
    "return others_noting(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4])")

# Link a key unless it has a link with a scope (``FactLog.link``; a value with no space is a link from before
# links had one, and serves nothing): {link}. KEYS: the link. ARGV: the new value.
LINK_LUA = """
local value = redis.call('GET', KEYS[1])
if not value or not string.find(value, ' ', 1, true) then
  redis.call('SET', KEYS[1], ARGV[1])
  value = ARGV[1]
end
return value
"""
