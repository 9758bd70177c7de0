"""The Redis store's operations in Lua, each one round trip: a function of one library
(``LIBRARY``, called with ``FCALL``) or, where the server has no functions or the user may not
use them, the same code as a script (``SCRIPTS``, run with ``EVALSHA``). Below, "script" means
either.

Keys of one lock table (``<p>`` is ``dblock:{<table>}:``; the hash tag keeps a table's keys
in one cluster slot, so a script may touch several):

- ``<p>r:<key>``: hash, the key's *record*, as the SQL stores' lock-table row: ``kind``,
  ``owner`` (absent: not held), ``token``, ``acq`` and ``exp`` (the hold's start and lease end,
  microseconds on the Redis server's clock), ``state`` and ``note`` (once-records), ``ended``
  (the token of the hold a release ended, so a retried release knows it succeeded),
  ``value`` (``"<token> -"`` or ``"<token> =<text>"``: what the hold ``token`` proclaimed,
  None or the text; it counts only while ``token`` is the record's, so it needs no
  clearing when a hold ends: every later hold of the key has a larger token);
- ``<p>h:<key>``: hash, owner -> ``"w kind token acq exp lease channel"``: shared holds
  (``w`` 0) and wait-queue entries (``w`` 1), each with its own lease, as the SQL stores'
  holders table. A queue entry's ``acq`` is its place, the table's arrival stamp (see
  ``arrival``); queue order is (``acq``, owner);
- ``<p>q:<key>``: sorted set, the key's lock-queue entries by place (owner scored by
  ``acq``): the index that finds the head, and those ahead of a waiter, without reading the
  whole holders hash (``walk``);
- ``<p>meta``: hash, ``token``: the last fencing token issued in the table; ``queued``: the
  last arrival stamp.

Scripts read ``TIME`` and then write: Redis must replicate them by their effects, its default
since 5.0 (always, from 7.0); a server set to ``lua-replicate-commands no`` refuses the write
with an error instead.

Every script gets KEYS = (record, holders, meta, queue index) of one key and ARGV = (key, the
table's channel, then its own arguments), except the batch scripts of ``list`` and ``purge``
and the ``*_many`` scripts of several keys (see MANY). Time is ``TIME`` read in the script,
never the client's clock; durations come in microseconds.

Tokens: ``max(last token + 1, TIME in microseconds, the record's token + 1)``. A Redis that
keeps nothing on disk forgets the last token on a restart; the clock then still puts every new
token above the ones issued before the restart, which were at most the clock of their issue
(one token per microsecond is more than Redis can issue). What breaks it: the data lost *and*
the server's clock stepped back (or a replica promoted whose clock is behind) by more than the
time the restart took.

Messages on the table's channel (and on a waiter's client's own): ``<owner> <key>``: a release
rings ``owner`` (everyone if empty); ``=<token> <owner> <key>``: the lock was handed to
``owner``; ``!<owner> <key>``: ``owner``'s hold was force-released. On the channel named
like a key's record (``<p>r:<key>``), which only its observers (LeaderPush) listen on:
``<key>``, the key was granted or its holder proclaimed.
"""

from __future__ import annotations

import hashlib

#: every operation's state, set by `begin` at its start: in a library of functions (see
#: LIBRARY) these are the library's locals, which each call sets afresh; NOBODY: a *_MANY
#: script found no holders hash on any of its keys (see no_holders); n: its number of keys
STATE = r"""
local KEYS, ARGV, R, H, META, Q, KEY, CHANNEL, NOW, NOBODY, n
local function begin(keys, args)
  KEYS, ARGV = keys, args
  R, H, META, Q = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  KEY, CHANNEL = ARGV[1], ARGV[2]
  local clock = redis.call('TIME')
  NOW = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  NOBODY = false
end
"""

PREAMBLE = r"""
-- a number as the integer it holds: '%d' costs a script a third of what '%.0f' does (0.15
-- against 0.41 µs, and a hand-over writes six), but it casts to a C long: only where that has 64
-- bits (a 32-bit build of Redis would cut microsecond stamps short), and only in its range
local WIDE
local function num(x)
  if WIDE == nil then WIDE = string.format('%d', 2 ^ 53) == '9007199254740992' end
  if WIDE and x > -9e18 and x < 9e18 then return string.format('%d', x) end
  return string.format('%.0f', x)
end

-- a grant or a proclaim of KEY is told to its observers (LeaderPush), who listen on the name
-- of its record as a channel: a PUBLISH that nobody listens to costs Redis a lookup. (A
-- release needs nothing more: it rings, or hands the lock on, which is a grant.)
local function told() redis.call('PUBLISH', R, KEY) end

local function record(rk)
  local v = redis.call('HGETALL', rk)
  if #v == 0 then return nil end
  local r = {}
  for i = 1, #v, 2 do r[v[i]] = v[i + 1] end
  r.token, r.acq, r.exp = tonumber(r.token), tonumber(r.acq), tonumber(r.exp)
  return r
end

-- the record as `record` reads it, less `acq`: all that taking, ending and handing on a lock
-- read (HMGET of these fields costs a script 1.0 µs, HGETALL and its loop 1.8 µs: the hot
-- single-key operations and the *_MANY scripts, which read one record per key, read this)
local function lock_record(rk)
  local v = redis.call('HMGET', rk, 'kind', 'owner', 'token', 'exp', 'state', 'note', 'ended')
  if not (v[1] or v[2] or v[3] or v[4] or v[5] or v[6] or v[7]) then return nil end
  return {kind = v[1] or nil, owner = v[2] or nil, token = tonumber(v[3]),
          exp = tonumber(v[4]), state = v[5] or nil, note = v[6] or nil, ended = v[7] or nil}
end

local function held(r) return r ~= nil and r.owner ~= nil and r.exp > NOW end

local function parse(v)
  local w, kind, tok, acq, exp, lease, chan =
    string.match(v, '^(%d) (%S+) (%d+) (%d+) (%d+) (%S+) ?(.*)$')
  return {w = (w == '1'), kind = kind, token = tonumber(tok), acq = tonumber(acq),
          exp = tonumber(exp), lease = tonumber(lease), chan = chan}
end

local function holders(hk)
  local v = redis.call('HGETALL', hk)
  local out = {}
  for i = 1, #v, 2 do out[v[i]] = parse(v[i + 1]) end
  return out
end

local function entry(owner)
  if NOBODY then return nil end
  local v = redis.call('HGET', H, owner)
  if not v then return nil end
  return parse(v)
end

-- a lock-queue entry is also put in the key's queue index (see `head`)
local function put(owner, e)
  redis.call('HSET', H, owner, table.concat({e.w and '1' or '0', e.kind, num(e.token),
    num(e.acq), num(e.exp), e.lease and num(e.lease) or '-', e.chan or ''}, ' '))
  if e.w and e.kind == 'lock' then redis.call('ZADD', Q, num(e.acq), owner) end
end

-- owner's entry (a shared hold or a queue entry) is removed, from the index too
local function unqueue(owner)
  redis.call('HDEL', H, owner)
  redis.call('ZREM', Q, owner)
end

-- the token issued after `last` (the table's last token) to a key whose record is r
local function token_after(last, r)
  local tok = math.max(last + 1, NOW)
  if r ~= nil and r.token ~= nil and r.token >= tok then tok = r.token + 1 end
  return tok
end

local function last_token() return tonumber(redis.call('HGET', META, 'token') or '0') end

local function next_token(r)
  local tok = token_after(last_token(), r)
  redis.call('HSET', META, 'token', num(tok))
  return tok
end

-- r: the record as read (each redis.call costs the script more than its command does, so
-- one HSET, and an HDEL only for fields r has; `ended` stays: it only ever names a token
-- whose hold a release ended, never a later one)
local function take(r, kind, owner, ttl, state, note)
  local tok = next_token(r)
  if r ~= nil and (r.state or r.note) then redis.call('HDEL', R, 'state', 'note') end
  local f = {'kind', kind, 'owner', owner, 'token', num(tok), 'acq', num(NOW),
    'exp', num(NOW + ttl)}
  if state then f[#f + 1] = 'state'; f[#f + 1] = state end
  if note then f[#f + 1] = 'note'; f[#f + 1] = note end
  redis.call('HSET', R, unpack(f))
  told()
  return tok
end

local function takeable(r, owner)
  return r == nil or (r.exp <= NOW and r.kind ~= 'once') or r.owner == owner
end

local function before(o, e, other, oe)
  return e.acq < oe.acq or (e.acq == oe.acq and o < other)
end

local function in_lock_queue(e) return e.w and e.kind == 'lock' and e.exp > NOW end

-- The key's queue index Q (a sorted set: owner scored by its entry's place, `acq`) lists the
-- lock-queue entries in queue order, (acq, owner), the order `before` defines: the head and
-- the waiters ahead of one are read from its start, not by parsing every entry of H (a
-- release with 512 waiters queued took 60 times as long). H stays the truth: a member whose
-- entry is gone, expired or no longer a lock-queue entry is dropped from Q when a walk meets
-- it. `walk(visit)` calls visit(owner, entry) for each live entry in order until it returns
-- true; it returns that owner and entry.
local function walk(visit)
  local start = 0
  while true do
    local batch = redis.call('ZRANGE', Q, start, start + 15)
    if #batch == 0 then return nil end
    local dead = {}
    for _, o in ipairs(batch) do
      local e = entry(o)
      if e ~= nil and in_lock_queue(e) then
        if visit(o, e) then
          if #dead > 0 then redis.call('ZREM', Q, unpack(dead)) end
          return o, e
        end
        start = start + 1
      else
        dead[#dead + 1] = o
      end
    end
    if #dead > 0 then redis.call('ZREM', Q, unpack(dead)) end
  end
end

-- live lock-queue entries ahead of owner's (all but owner's own if it has none; all if nil),
-- counted up to `limit` (nil: all)
local function ahead(owner, limit)
  if NOBODY then return 0 end
  local mine = owner and entry(owner)
  if mine and not mine.w then mine = nil end
  local n = 0
  walk(function(o, e)
    if o == owner then return false end
    if mine and not before(o, e, owner, mine) then return true end  -- the rest come after
    n = n + 1
    return limit ~= nil and n >= limit
  end)
  return n
end

-- the first live lock-queue entry other than `besides`: its owner and entry, or nil
local function head(besides)
  if NOBODY then return nil end
  return walk(function(o) return o ~= besides end)
end

-- an ownerless record's lease covers the live shared holds again
local function recover(r, hs)
  if r == nil or r.owner ~= nil then return end
  local c = NOW
  for _, e in pairs(hs) do if not e.w and e.exp > c then c = e.exp end end
  redis.call('HSET', R, 'exp', num(c))
end

local function ring(owner) redis.call('PUBLISH', CHANNEL, (owner or '') .. ' ' .. KEY) end

-- wake the head of the lock queue, or everyone if nobody queues for the lock
local function ring_next() ring((head())) end

local function free(r, ended)
  redis.call('HDEL', R, 'owner')
  if ended then
    redis.call('HSET', R, 'exp', num(NOW), 'ended', num(ended))
  else
    redis.call('HSET', R, 'exp', num(NOW))
  end
end

-- the hold of r ended: the lock goes to the head waiter that takes hand-overs (a new token,
-- a lease of its own ttl but no longer than its queue entry's), told on its client's channel;
-- else it is freed and the head (or everyone) is rung
local function hand_on(r, ended)
  local ho, he = head()
  if ho and he.lease then
    local tok = next_token(r)
    redis.call('HSET', R, 'kind', 'lock', 'owner', ho, 'token', num(tok), 'acq', num(NOW),
      'exp', num(math.min(NOW + he.lease, he.exp)), 'ended', num(ended))
    if r.state or r.note then redis.call('HDEL', R, 'state', 'note') end
    unqueue(ho)
    local chan = CHANNEL
    if he.chan ~= '' then chan = he.chan end
    redis.call('PUBLISH', chan, '=' .. num(tok) .. ' ' .. ho .. ' ' .. KEY)
    told()
    return
  end
  free(r, ended)
  ring(ho)
end

local function leave_queue(owner)
  local e = entry(owner)
  if e and e.w then unqueue(owner) end
end

local function waiting(e) return e ~= nil and e.w and e.exp > NOW end

-- A new queue entry's place: the table's arrival stamp, max(last stamp + 1, TIME), taken by
-- every script that makes entries (single-key or many). Stamps rise with each script,
-- table-wide, and a script stamps all its entries with one value: the order of any key's
-- queue is the order in which the scripts that made its entries ran. So a waiter for several
-- keys, whose entries one script makes (ENQUEUE_MANY), holds one place in an order common to
-- all keys: X ahead of Y on one key is ahead on every key they share, and they never wait
-- for each other. What would break it: entries of one waiter made by several scripts, or a
-- live entry keeping its old place on some keys while the others are new (ENQUEUE_MANY
-- replaces them all). TIME alone would keep the order common but not arrival order: a server
-- clock stepped back would put later arrivals ahead of earlier ones for as long as the step.
local function arrival()
  local q = math.max(tonumber(redis.call('HGET', META, 'queued') or '0') + 1, NOW)
  redis.call('HSET', META, 'queued', num(q))
  return q
end

-- the place of owner's entry e: its own while it is live (a refresh keeps it), else a new one
local function place(e)
  if waiting(e) then return e.acq end
  return arrival()
end

-- owner's entry leaves the queue (r: the record); if the lock is free, the next head is rung
-- (a ring meant for owner is not lost with it). True if it had an entry.
local function quit(owner, r)
  local e = entry(owner)
  if not (e and e.w) then return false end
  unqueue(owner)
  if r == nil or r.owner == nil or r.exp <= NOW then
    local ho = head()
    if ho then ring(ho) end
  end
  return true
end
"""

# -- locks ------------------------------------------------------------------------------------

# owner ttl kind -> the new token, or nil if held. A live record is taken only by its own
# owner (an idempotent retry); a once-record never by a lock.
ACQUIRE = r"""
local owner = ARGV[3]
local r = lock_record(R)
if not takeable(r, owner) then return false end
return take(r, ARGV[5], owner, tonumber(ARGV[4]))
"""

# owner token ttl -> 1 if the live hold was extended
RENEW = r"""
local r = lock_record(R)
if not (held(r) and r.owner == ARGV[3] and r.token == tonumber(ARGV[4])) then return 0 end
redis.call('HSET', R, 'exp', num(NOW + tonumber(ARGV[5])))
return 1
"""

# owner token retry -> 1 if the live hold was ended (and handed on); a retry (after a lost
# reply) also when the record shows that this token's release already happened
RELEASE = r"""
local r = lock_record(R)
local tok = tonumber(ARGV[4])
if held(r) and r.owner == ARGV[3] and r.token == tok then
  hand_on(r, tok)
  return 1
end
if ARGV[5] == '1' and r ~= nil and tonumber(r.ended) == tok then return 1 end
return 0
"""

# -> {owner, token, acq, exp, kind} of the live hold (the first shared one), or nil
INFO = r"""
local r = record(R)
if held(r) then return {r.owner, num(r.token), num(r.acq), num(r.exp), r.kind} end
local bo, be = nil, nil
for o, e in pairs(holders(H)) do
  if not e.w and e.exp > NOW and (be == nil or before(o, e, bo, be)) then bo, be = o, e end
end
if bo == nil then return false end
return {bo, num(be.token), num(be.acq), num(be.exp), be.kind}
"""

# KEYS: n records, then their n holders -> flat {i, owner, token, acq, exp, kind, ...} of
# every live hold of the i-th key
LIST = r"""
local n = #KEYS / 2
local out = {}
for i = 1, n do
  local r = record(KEYS[i])
  if held(r) then
    for _, v in ipairs({tostring(i), r.owner, num(r.token), num(r.acq), num(r.exp), r.kind}) do
      out[#out + 1] = v
    end
  end
  for o, e in pairs(holders(KEYS[n + i])) do
    if not e.w and e.exp > NOW then
      for _, v in ipairs({tostring(i), o, num(e.token), num(e.acq), num(e.exp), e.kind}) do
        out[#out + 1] = v
      end
    end
  end
end
return out
"""

# -> 1 if a live hold was ended; its holders hear of it (`!<owner> <key>`)
FORCE_RELEASE = r"""
local r = record(R)
local freed = 0
if held(r) then
  redis.call('PUBLISH', CHANNEL, '!' .. r.owner .. ' ' .. KEY)
  free(r, nil)
  r.owner = nil
  freed = 1
end
local hs = holders(H)
for o, e in pairs(hs) do
  if not e.w and e.exp > NOW then
    redis.call('PUBLISH', CHANNEL, '!' .. o .. ' ' .. KEY)
    redis.call('HDEL', H, o)
    hs[o] = nil
    freed = 1
  end
end
if freed == 1 then
  recover(r, hs)
  ring((head()))
end
return freed
"""

# KEYS: n records, then their n holders; older_than include_once -> records deleted: not
# held, ended more than older_than ago, once-records only with include_once and an outcome,
# and without live holders. The table's last token stays (meta), so none is issued again.
PURGE_RECORDS = r"""
local n = #KEYS / 2
local cut = NOW - tonumber(ARGV[1])
local with_once = ARGV[2] == '1'
local count = 0
for i = 1, n do
  local r = record(KEYS[i])
  if r ~= nil and r.exp <= cut and (r.kind ~= 'once' or
      (with_once and (r.state == 'succeeded' or r.state == 'failed'))) then
    local live = false
    for _, e in pairs(holders(KEYS[n + i])) do
      if e.exp > NOW then live = true end
    end
    if not live then
      redis.call('DEL', KEYS[i])
      count = count + 1
    end
  end
end
return count
"""

# KEYS: holders of n keys, then their queue indexes; older_than -> holds and queue entries
# deleted (ended that long ago)
PURGE_HOLDERS = r"""
local n = #KEYS / 2
local cut = NOW - tonumber(ARGV[1])
local count = 0
for i = 1, n do
  for o, e in pairs(holders(KEYS[i])) do
    if e.exp <= cut then
      redis.call('HDEL', KEYS[i], o)
      redis.call('ZREM', KEYS[n + i], o)
      count = count + 1
    end
  end
end
return count
"""

# KEYS: queue indexes of n keys, then their holders -> 0; members without a lock-queue entry
# leave (an index left behind by entries deleted with their hash)
PURGE_QUEUES = r"""
local n = #KEYS / 2
for i = 1, n do
  for _, o in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
    local v = redis.call('HGET', KEYS[n + i], o)
    local e = v and parse(v)
    if not (e and e.w and e.kind == 'lock') then redis.call('ZREM', KEYS[i], o) end
  end
end
return 0
"""

# -- leader values (LeaderValues) --------------------------------------------------------------

# owner token value ('-': None, else '=' .. text) -> 1 if owner's live hold `token` now
# carries it (any exclusive kind: LEADER shows a lock's only); else 0, nothing written
PROCLAIM = r"""
local r = lock_record(R)
if not (held(r) and r.owner == ARGV[3] and r.token == tonumber(ARGV[4])) then return 0 end
redis.call('HSET', R, 'value', num(r.token) .. ' ' .. ARGV[5])
told()
return 1
"""

# -> {owner, token, acq, exp, kind, value ('' if none)} of the live lock hold, or nil; the
# caller counts the value only if it names that token
LEADER = r"""
local v = redis.call('HMGET', R, 'kind', 'owner', 'token', 'acq', 'exp', 'value')
if v[1] ~= 'lock' or not v[2] or tonumber(v[5]) <= NOW then return false end
return {v[2], v[3], v[4], v[5], v[1], v[6] or ''}
"""

# -- the wait queue ---------------------------------------------------------------------------

# owner ttl queued -> the token, if nobody live queues ahead of owner (anybody, if owner is not
# queued) or the lock is already owner's (handed over, its message missed); leaves the queue
ACQUIRE_FAIR = r"""
local owner = ARGV[3]
local r = lock_record(R)
local mine = held(r) and r.owner == owner
local queued = nil
if ARGV[5] == '1' then queued = owner end
if not takeable(r, owner) then return false end
if not mine and ahead(queued, 1) > 0 then return false end
local tok = take(r, 'lock', owner, tonumber(ARGV[4]))
leave_queue(owner)
return tok
"""

# owner -> {the lock is free, live waiters ahead of owner}
PROBE = r"""
local r = record(R)
local free = 0
if r == nil or r.exp <= NOW then free = 1 end
return {free, ahead(ARGV[3])}
"""

# owner kind ttl lease channel -> makes or refreshes owner's queue entry (a live one keeps its
# place); lease '-': the lock is never handed to it
ENQUEUE = r"""
local owner = ARGV[3]
put(owner, {w = true, kind = ARGV[4], token = 0, acq = place(entry(owner)),
            exp = NOW + tonumber(ARGV[5]), lease = tonumber(ARGV[6]), chan = ARGV[7]})
return 1
"""

# owner ttl -> 1 if owner's live entry was refreshed (never re-made: one a hand-over removed
# stays gone)
REQUEUE = r"""
local e = entry(ARGV[3])
if not waiting(e) then return 0 end
e.exp = NOW + tonumber(ARGV[4])
put(ARGV[3], e)
return 1
"""

# owner -> leaves the queue; if the lock is free, the next head is rung (a ring meant for
# owner is not lost with it); if it was handed to owner meanwhile, it is handed on
DEQUEUE = r"""
local owner = ARGV[3]
local r = record(R)
if quit(owner, r) then return 1 end
if held(r) and r.owner == owner then hand_on(r, r.token) end
return 0
"""

# owner ttl queue_ttl channel -> the token if taken as a newcomer; else owner joins the
# queue (taking hand-overs of ttl, told on channel) and nil
ACQUIRE_OR_ENQUEUE = r"""
local owner, ttl = ARGV[3], tonumber(ARGV[4])
local r = lock_record(R)
local mine = held(r) and r.owner == owner
if takeable(r, owner) and (mine or ahead(nil, 1) == 0) then
  local tok = take(r, 'lock', owner, ttl)
  leave_queue(owner)
  return tok
end
put(owner, {w = true, kind = 'lock', token = 0, acq = place(entry(owner)),
            exp = NOW + tonumber(ARGV[5]), lease = ttl, chan = ARGV[6]})
return false
"""

# -- shared holds: read holds, semaphore permits, and the write hold ---------------------------

# owner ttl kind permits('-': a read hold) -> the token of a new shared hold, or nil: the
# record is held, another kind holds the key, a writer or a lock waits for it, or every
# permit is taken
ACQUIRE_SHARED = r"""
local owner, ttl, kind, permits = ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local r = record(R)
if held(r) then return false end
local hs = holders(H)
local taken = 0
for o, e in pairs(hs) do
  if e.exp > NOW then
    if (not e.w and e.kind ~= kind) or (e.w and (e.kind == 'write' or e.kind == 'lock')) then
      return false
    end
    if not e.w and e.kind == kind and o ~= owner then taken = taken + 1 end
  end
end
if permits and taken >= permits then return false end
local tok = next_token(r)
put(owner, {w = false, kind = kind, token = tok, acq = NOW, exp = NOW + ttl})
if r == nil then
  redis.call('HSET', R, 'kind', 'lock', 'acq', num(NOW))
  r = {}
end
redis.call('HDEL', R, 'owner')
redis.call('HSET', R, 'token', num(tok))
r.owner = nil
recover(r, holders(H))
return tok
"""

# owner token retry -> 1 if the live shared hold was ended (a retry: if it is gone)
RELEASE_SHARED = r"""
local owner, tok = ARGV[3], tonumber(ARGV[4])
local e = entry(owner)
local mine = e ~= nil and not e.w and e.token == tok
if mine and e.exp > NOW then
  redis.call('HDEL', H, owner)
  recover(record(R), holders(H))
  ring(nil)
  return 1
end
if ARGV[5] == '1' and not mine then return 1 end
return 0
"""

# owner token ttl -> 1 if the live shared hold was extended
RENEW_SHARED = r"""
local owner, tok = ARGV[3], tonumber(ARGV[4])
local e = entry(owner)
if not (e and not e.w and e.token == tok and e.exp > NOW) then return 0 end
e.exp = NOW + tonumber(ARGV[5])
put(owner, e)
recover(record(R), holders(H))
return 1
"""

# owner ttl -> the token of the write hold, when nobody else holds the record and no shared
# hold is live (a once-record is never taken: it would be erased)
ACQUIRE_WRITE = r"""
local owner = ARGV[3]
local r = record(R)
if r ~= nil and r.exp > NOW and r.owner ~= owner then return false end
local hs = holders(H)
for _, e in pairs(hs) do
  if not e.w and e.exp > NOW then return false end
end
if r ~= nil and r.kind == 'once' then return false end
local tok = take(r, 'write', owner, tonumber(ARGV[4]))
leave_queue(owner)
return tok
"""

# -- once-records and scheduled runs ----------------------------------------------------------

# owner ttl has_note note -> the token if the once-record was claimed: absent, failed, or
# processing with an expired lease (its holder crashed)
CLAIM_ONCE = r"""
local owner = ARGV[3]
local r = record(R)
local claimable = r == nil or (r.kind ~= 'once' and r.exp <= NOW) or (r.kind == 'once' and
  (r.state == 'failed' or (r.state == 'processing' and r.exp <= NOW))) or r.owner == owner
if not claimable then return false end
local note = nil
if ARGV[5] == '1' then note = ARGV[6] end
return take(r, 'once', owner, tonumber(ARGV[4]), 'processing', note)
"""

# -> {kind, has_state, state, live} or nil
ONCE_STATE = r"""
local r = record(R)
if r == nil then return false end
local live = 0
if r.exp > NOW then live = 1 end
return {r.kind, r.state and 1 or 0, r.state or '', live}
"""

# owner token state retry -> 1 if the outcome was recorded and the hold ended
FINISH_ONCE = r"""
local r = record(R)
local tok = tonumber(ARGV[4])
if r ~= nil and r.owner == ARGV[3] and r.token == tok and r.kind == 'once' then
  free(r, tok)
  redis.call('HSET', R, 'state', ARGV[5])
  ring_next()
  return 1
end
if ARGV[6] == '1' and r ~= nil and r.token == tok then return 1 end
return 0
"""

# owner token at_least retry -> 1 if the hold ended, or is kept until at_least after its start
FINISH_SCHEDULED = r"""
local r = record(R)
local tok = tonumber(ARGV[4])
if r ~= nil and r.owner == ARGV[3] and r.token == tok then
  local keep = r.acq + tonumber(ARGV[5])
  if keep > NOW then
    redis.call('HSET', R, 'exp', num(keep))
  else
    free(r, tok)
    ring_next()
  end
  return 1
end
if ARGV[6] == '1' and r ~= nil and r.token == tok then return 1 end
return 0
"""

# -- fenced grants (FencedGrants, for a quorum: docs/stores/quorum.md) -----------------------------
# A key's fence is its record's token, else the table's last token (which covers purged
# records): a fenced grant raises the table's last token to its own. The fence read is
# floored by TIME, so that a quorum's token rises even where every fence was lost.

# -> the key's fence, floored by the server's clock in microseconds, as a decimal string
FENCE = r"""
local r = record(R)
if r ~= nil and r.token ~= nil then return num(math.max(r.token, NOW)) end
return num(math.max(tonumber(redis.call('HGET', META, 'token') or '0'), NOW))
"""

# owner ttl kind token -> 1 if granted with `token`: free or expired (or owner's own) and
# fenced below `token`; or already owner's live hold with `token` (a retry)
GRANT_FENCED = r"""
local owner, tok = ARGV[3], tonumber(ARGV[6])
local r = record(R)
if held(r) and r.owner == owner and r.token == tok then return 1 end
local last = tonumber(redis.call('HGET', META, 'token') or '0')
local fence = last
if r ~= nil and r.token ~= nil then fence = r.token end
if fence >= tok or not takeable(r, owner) then return 0 end
if r ~= nil and (r.state or r.note) then redis.call('HDEL', R, 'state', 'note') end
redis.call('HSET', R, 'kind', ARGV[5], 'owner', owner, 'token', num(tok), 'acq', num(NOW),
  'exp', num(NOW + tonumber(ARGV[4])))
told()
if last < tok then redis.call('HSET', META, 'token', num(tok)) end
return 1
"""

# owner -> 1 if owner's live hold (any token) was ended
RELEASE_OWNED = r"""
local r = record(R)
if held(r) and r.owner == ARGV[3] then
  hand_on(r, r.token)
  return 1
end
return 0
"""

# -- fenced grants of several keys (FencedManyGrants): *_MANY scripts (KEYS, ARGV: see MANY
# below), each key fenced, granted or ended as the single-key scripts above do it

# keys -> {fence, ...} of each key, as FENCE reads it
FENCE_MANY = r"""
local last = tonumber(redis.call('HGET', META, 'token') or '0')
local out = {}
for i = 1, n do
  at(i)
  local r = lock_record(R)
  local fence = last
  if r ~= nil and r.token ~= nil then fence = r.token end
  out[i] = num(math.max(fence, NOW))
end
return out
"""

# owner ttl keys tokens -> 1 if every key was granted as a lock with its token (each as
# GRANT_FENCED grants it), else 0 with none granted: every key is checked before any is written
GRANT_FENCED_MANY = r"""
local owner, ttl = ARGV[3], tonumber(ARGV[4])
local last = tonumber(redis.call('HGET', META, 'token') or '0')
local top, rs, fresh = last, {}, {}
for i = 1, n do
  at(i)
  local r, tok = lock_record(R), tonumber(ARGV[4 + n + i])
  if not (held(r) and r.owner == owner and r.token == tok) then
    local fence = last
    if r ~= nil and r.token ~= nil then fence = r.token end
    if fence >= tok or not takeable(r, owner) then return 0 end
    rs[i], fresh[i] = r, true
  end
  top = math.max(top, tok)
end
for i = 1, n do
  if fresh[i] then
    at(i)
    local r = rs[i]
    if r ~= nil and (r.state or r.note) then redis.call('HDEL', R, 'state', 'note') end
    redis.call('HSET', R, 'kind', 'lock', 'owner', owner, 'token', ARGV[4 + n + i],
      'acq', num(NOW), 'exp', num(NOW + ttl))
    told()
  end
end
if top > last then redis.call('HSET', META, 'token', num(top)) end
return 1
"""

# owner keys -> 1 if one of owner's live holds (any token) was ended (each as RELEASE_OWNED)
RELEASE_OWNED_MANY = r"""
local owner, ended = ARGV[3], 0
for i = 1, n do
  at(i)
  local r = lock_record(R)
  if held(r) and r.owner == owner then
    hand_on(r, r.token)
    ended = 1
  end
end
return ended
"""

# -- several keys at once (ManyKeys, FairManyKeys) ---------------------------------------------
# KEYS: (record, holders, queue index) of each of n keys, then meta; ARGV: ('', channel, owner,
# ttl or retry, the n keys, then n tokens for renew and release). The preamble's R, H, Q, KEY
# (upvalues of its functions) are pointed at each key in turn, so every key is handled by the
# single-key code.
# One script, one TIME: the whole step is atomic on the server and sees one instant.

#: the *_MANY scripts' preamble (after PREAMBLE's)
MANY = r"""
local function begin_many()
  n = (#KEYS - 1) / 3
  META = KEYS[#KEYS]
end
local function at(i) R, H, Q, KEY = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[4 + i] end

-- True if no key has a holders hash (nobody queues, no shared holds: most takes and releases
-- of a set), and then no queue is read for the rest of the script (one EXISTS instead of a
-- walk of each key's queue index, for the fairness check and the head to hand on to; a
-- member an index may keep has no entry). Only for a script that makes no holders entry, so
-- none can appear while it runs.
local function no_holders()
  local hk = {}
  for i = 1, n do hk[i] = KEYS[3 * i - 1] end
  if redis.call('EXISTS', unpack(hk)) > 0 then return false end
  NOBODY = true
  return true
end

-- lock_record's hold fields only: owner, token, exp, ended
local function hold_record(rk)
  local v = redis.call('HMGET', rk, 'owner', 'token', 'exp', 'ended')
  if not (v[1] or v[2] or v[3] or v[4]) then return nil end
  return {owner = v[1] or nil, token = tonumber(v[2]), exp = tonumber(v[3]), ended = v[4] or nil}
end
"""

# owner ttl keys -> the token of each key, in the keys' order (integers), or nil with nothing
# taken: each key is checked as ACQUIRE_FAIR checks a waiter (takeable, and unless already
# owner's no live waiter ahead of `queued`: a newcomer's nil, anyone; a many-waiter's owner,
# those ahead of its entry) before any is written; owner's entries leave the queues
TAKE_MANY = r"""
local owner, ttl = ARGV[3], tonumber(ARGV[4])
no_holders()
local rs = {}
for i = 1, n do
  at(i)
  local r = lock_record(R)
  local mine = held(r) and r.owner == owner
  if not takeable(r, owner) or (not mine and ahead(queued, 1) > 0) then return false end
  rs[i] = r
end
-- each key taken as `take` takes it, with the tokens `next_token` would issue one after the
-- other; but the table's last token is read and written once and the times formatted once
-- (each redis.call, and each num, costs the script about a microsecond per key)
local last, acq, exp = last_token(), num(NOW), num(NOW + ttl)
local out = {}
for i = 1, n do
  at(i)
  local r = rs[i]
  last = token_after(last, r)
  local tok = num(last)
  if r ~= nil and (r.state or r.note) then redis.call('HDEL', R, 'state', 'note') end
  redis.call('HSET', R, 'kind', 'lock', 'owner', owner, 'token', tok, 'acq', acq, 'exp', exp)
  told()
  leave_queue(owner)
  out[i] = last
end
redis.call('HSET', META, 'token', num(last))
return out
"""

ACQUIRE_MANY = "local queued = nil\n" + TAKE_MANY
ACQUIRE_MANY_IN_TURN = "local queued = ARGV[3]\n" + TAKE_MANY

# owner ttl keys -> 1: owner's entry on every key (kind lock, no lease: a release never hands
# it a lock, it frees the key and rings owner), all at one new place (see `arrival`): a fresh
# arrival, replacing the entries owner had. A retry after a lost reply makes them again, a
# little later in the order.
ENQUEUE_MANY = r"""
local e = {w = true, kind = 'lock', token = 0, acq = arrival(), exp = NOW + tonumber(ARGV[4])}
for i = 1, n do
  at(i)
  put(ARGV[3], e)
end
return 1
"""

# owner ttl keys -> 1 if owner's entries were all live, at one place, and were extended
# (keeping it); else 0 and nothing is written (the caller enqueues afresh)
REQUEUE_MANY = r"""
local owner = ARGV[3]
local es = {}
for i = 1, n do
  at(i)
  local e = entry(owner)
  if not waiting(e) or (i > 1 and e.acq ~= es[1].acq) then return 0 end
  es[i] = e
end
for i = 1, n do
  at(i)
  es[i].exp = NOW + tonumber(ARGV[4])
  put(owner, es[i])
end
return 1
"""

# owner '' keys -> owner's entries leave the queues; each free key's next head is rung
DEQUEUE_MANY = r"""
for i = 1, n do
  at(i)
  quit(ARGV[3], lock_record(R))
end
return 1
"""

# owner ttl keys tokens -> 1 if every hold was live and was extended (the live ones are, always)
RENEW_MANY = r"""
local owner, ttl = ARGV[3], tonumber(ARGV[4])
local all = 1
for i = 1, n do
  at(i)
  local r = lock_record(R)
  if held(r) and r.owner == owner and r.token == tonumber(ARGV[4 + n + i]) then
    redis.call('HSET', R, 'exp', num(NOW + ttl))
  else
    all = 0
  end
end
return all
"""

# owner retry keys tokens -> 1 if every hold was live and was ended (each as RELEASE ends it:
# handed on, rung); a retry also counts a hold the first attempt ended
RELEASE_MANY = r"""
local owner, retry = ARGV[3], ARGV[4] == '1'
-- with nobody queued on any key, hand_on only frees each record: the hold's fields are all
-- it reads (an HMGET of 4 fields, not lock_record's 7)
local read = lock_record
if no_holders() then read = hold_record end
local all = 1
for i = 1, n do
  at(i)
  local r = read(R)
  local tok = tonumber(ARGV[4 + n + i])
  if held(r) and r.owner == owner and r.token == tok then
    hand_on(r, tok)
  elseif not (retry and r ~= nil and tonumber(r.ended) == tok) then
    all = 0
  end
end
return all
"""

_BODIES: dict[str, str] = {
    "ACQUIRE": ACQUIRE,
    "RENEW": RENEW,
    "RELEASE": RELEASE,
    "INFO": INFO,
    "LIST": LIST,
    "FORCE_RELEASE": FORCE_RELEASE,
    "PURGE_RECORDS": PURGE_RECORDS,
    "PURGE_HOLDERS": PURGE_HOLDERS,
    "PURGE_QUEUES": PURGE_QUEUES,
    "ACQUIRE_FAIR": ACQUIRE_FAIR,
    "PROBE": PROBE,
    "ENQUEUE": ENQUEUE,
    "REQUEUE": REQUEUE,
    "DEQUEUE": DEQUEUE,
    "ACQUIRE_OR_ENQUEUE": ACQUIRE_OR_ENQUEUE,
    "ACQUIRE_SHARED": ACQUIRE_SHARED,
    "RELEASE_SHARED": RELEASE_SHARED,
    "RENEW_SHARED": RENEW_SHARED,
    "ACQUIRE_WRITE": ACQUIRE_WRITE,
    "CLAIM_ONCE": CLAIM_ONCE,
    "ONCE_STATE": ONCE_STATE,
    "FINISH_ONCE": FINISH_ONCE,
    "FINISH_SCHEDULED": FINISH_SCHEDULED,
    "FENCE": FENCE,
    "GRANT_FENCED": GRANT_FENCED,
    "RELEASE_OWNED": RELEASE_OWNED,
    "FENCE_MANY": FENCE_MANY,
    "GRANT_FENCED_MANY": GRANT_FENCED_MANY,
    "RELEASE_OWNED_MANY": RELEASE_OWNED_MANY,
    "ACQUIRE_MANY": ACQUIRE_MANY,
    "ACQUIRE_MANY_IN_TURN": ACQUIRE_MANY_IN_TURN,
    "ENQUEUE_MANY": ENQUEUE_MANY,
    "REQUEUE_MANY": REQUEUE_MANY,
    "DEQUEUE_MANY": DEQUEUE_MANY,
    "RENEW_MANY": RENEW_MANY,
    "RELEASE_MANY": RELEASE_MANY,
    "PROCLAIM": PROCLAIM,
    "LEADER": LEADER,
}

#: operations that never write: their functions are flagged so (they run where writes are
#: refused, a server out of memory, as their scripts do)
_READ_ONLY = frozenset({"INFO", "LIST", "LEADER", "ONCE_STATE", "FENCE", "FENCE_MANY"})


def _begin(name: str) -> str:
    return "begin(keys, args)\n" + ("begin_many()\n" if "_MANY" in name else "")


#: script name -> its source, for ``EVALSHA``: the state, the shared functions, then the body
SCRIPTS: dict[str, str] = {
    name.lower(): "local keys, args = KEYS, ARGV\n"
    + STATE
    + PREAMBLE
    + (MANY if "_MANY" in name else "")
    + _begin(name)
    + body
    for name, body in _BODIES.items()
}


def _function(library: str, op: str) -> str:
    """The name of operation ``op``'s function in the library named ``library``."""
    return f"{library}_{op.lower()}"


def _library(name: str) -> str:
    functions = []
    for op, body in _BODIES.items():
        flags = "{'no-writes'}" if op in _READ_ONLY else "{}"
        functions.append(
            f"redis.register_function{{function_name='{_function(name, op)}', flags={flags},\n"
            f"callback=function(keys, args)\n{_begin(op)}{body}end}}\n"
        )
    return f"#!lua name={name}\n" + STATE + PREAMBLE + MANY + "".join(functions)


#: the name of this version's library of functions (``FUNCTION LOAD``; its functions are
#: ``<name>_<script name>``): it names its code's hash, so that clients of two versions of
#: dblock on one server each call their own
LIBRARY_NAME = "dblock_" + hashlib.sha256(_library("dblock").encode()).hexdigest()[:16]
#: every operation as a function of one library (Redis 7): its shared functions are made
#: once, when the library is loaded, not at every call as a script's are
LIBRARY = _library(LIBRARY_NAME)
#: script name (as in SCRIPTS) -> the name of its function in LIBRARY
FUNCTIONS: dict[str, str] = {op.lower(): _function(LIBRARY_NAME, op) for op in _BODIES}
