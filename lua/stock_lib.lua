-- stock_lib.lua - helpers shared by the prefilter scripts.  Not a script of
-- its own: a script that needs it has a line made of "--#include" and this
-- file's name, which the build (the Lua embedding step of
-- rm-client/CMakeLists.txt) replaces with this file's text, so the script
-- Redis loads and runs is one self-contained chunk.  Everything here is local: Redis scripts may not
-- create globals.
--
-- Key layout of one activity A (decimal id), all under the hash tag {act_A}
-- so that every key of a call hashes to one Redis Cluster slot.  Scripts
-- never build key names: the caller passes every key in KEYS.
--   {act_A}:meta        hash   status (0 not started, 1 on sale, 2 ended),
--                              limit (most tickets one user may hold),
--                              starts, ends (the sale window, unix ms;
--                              optional: see pf_on_sale),
--                              hold (optional: see pf_held)
--   {act_A}:t<T>:stock  hash   n (number of buckets of ticket type T) and,
--                              for each bucket i in 0..n-1: stock:i,
--                              frozen:i, sold:i
--   {act_A}:bought      hash   user id -> tickets the user holds (frozen or
--                              sold) in the activity
--   {act_A}:orders      hash   order id -> freeze record (below); kept after
--                              confirm/release as the exactly-once tombstone
--   {act_A}:t<T>:expiry zset   order id -> freeze deadline (unix ms), for
--                              frozen orders only
--   {act_A}:t<T>:wl     zset   waitlist: user id -> arrival number
--   {act_A}:t<T>:wlq    hash   waitlist: user id -> wanted quantity
--   {act_A}:t<T>:wlseq  string waitlist arrival counter
--
-- Freeze record: "S:T:B:Q:U" with S the state (F frozen, C confirmed, R
-- released), T ticket type, B bucket, Q quantity, U user id.  librmclient's
-- reconciliation writes the same format (rm_prefilter_keys.c).
--
-- Result codes shared by every script (librmclient maps -k to -10400 - k):
--   -1 not on sale   -2 over limit     -3 sold out        -4 bad arguments
--   -5 activity not loaded (no {act_A}:meta)
--   -6 order already confirmed  -7 order already released  -8 unknown order
--   -9 held: librmclient's reconciliation holds the activity (pf_held);
--      nothing changed, the same call may be repeated once the hold ends
--
-- Argument checks: ids are decimal integers 1 .. 2^63-1 (leading zeros are
-- accepted and dropped, so "0042" and "42" are the same order); quantities
-- 1 .. 10000; anything else (negative, fractional, "1e3", " 1", "0x10",
-- missing) is -4 and nothing changes.

local PF_MAX_QTY = 10000

-- A canonical id string (no leading zeros), or nil.
local function pf_id(s)
  if type(s) ~= 'string' then return nil end
  local d = string.match(s, '^0*([1-9]%d*)$')
  if d == nil or #d > 19 then return nil end
  if #d == 19 and d > '9223372036854775807' then return nil end
  return d
end

-- An integer in [lo, hi] (at most 16 characters, so exact in a double), or nil.
local function pf_int(s, lo, hi)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^%-?%d+$') then return nil end
  local n = tonumber(s)
  if n == nil or n < lo or n > hi then return nil end
  return n
end

local function pf_qty(s) return pf_int(s, 1, PF_MAX_QTY) end

-- Whether the activity is on sale now, from its meta fields 'status',
-- 'starts' and 'ends' (strings or nil): status 1 and, when the window is
-- there, the Redis server's clock (TIME) inside [starts, ends).  The
-- same rule as PostgreSQL's activity_on_sale (sql/stock/006): status is
-- what stock-service's window job sets at the times, and the times close
-- the sale exactly at 'ends' even when the job is late or stopped.  The
-- server's clock, not the caller's: one clock for every order-service, and
-- nothing a caller passes can open a sale.  A window field that is not a
-- number closes the sale.  (TIME before writes is allowed: scripts are
-- replicated by their effects.)
-- The Redis server's clock, unix milliseconds.
local function pf_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function pf_on_sale(status, starts, ends)
  if status ~= '1' then return false end
  if not starts and not ends then return true end
  local now = pf_now()
  if starts and not (now >= (tonumber(starts) or math.huge)) then return false end
  if ends and not (now < (tonumber(ends) or -math.huge)) then return false end
  return true
end

-- Whether the activity is held, from its meta field 'hold' (a string or
-- nil): a deadline in unix ms on the Redis server's clock, set by
-- librmclient's reconciliation (hold.lua) when the sale's own writes kept
-- aborting its WATCHed round, and deleted by the round that succeeds.
-- Every script that writes a key the reconciliation watches (the meta,
-- stock, bought, orders and expiry keys) answers -9 and changes nothing
-- while now < hold; the library waits and calls again.  A hold whose
-- reconciler died ends by itself at its deadline.  A value that is not a
-- number holds nothing.
local function pf_held(hold)
  if not hold then return false end
  local until_ms = tonumber(hold)
  return until_ms ~= nil and pf_now() < until_ms
end

-- A hash field holding a count: a missing field is 0.
local function pf_num(v)
  if not v then return 0 end
  return tonumber(v) or 0
end

-- Parse a freeze record into state, ticket type, bucket, qty, user; nil if
-- it is not one.
local function pf_rec_parse(rec)
  if not rec then return nil end
  local s, t, b, q, u = string.match(rec, '^([FCR]):(%d+):(%d+):(%d+):(%d+)$')
  if not s then return nil end
  return s, tonumber(t), tonumber(b), tonumber(q), u
end

local function pf_rec(state, tt, bucket, qty, user)
  return state .. ':' .. tt .. ':' .. bucket .. ':' .. qty .. ':' .. user
end

-- The code an existing record of 'order' answers a second freeze with: its
-- bucket when it is the same freeze (a retry after a lost answer), else
-- -6/-7 for a finished order or -4 for another user, type or quantity.
local function pf_replay(rec, tt, user, qty)
  local s, t, b, q, u = pf_rec_parse(rec)
  if not s then return -4 end
  if s == 'C' then return -6 end
  if s == 'R' then return -7 end
  if t ~= tt or u ~= user or q ~= qty then return -4 end
  return b
end

-- The frozen order of a confirm or a release: 'tt_arg' and 'order_arg'
-- as passed (ARGV), the order's record in the hash 'orders'.  A table
-- {order, tt, b, q, u} (canonical order id, ticket type, bucket, qty,
-- user); or nil and the script's answer: -4 bad arguments or another
-- ticket type's order, -8 no freeze of this order, -6 confirmed before,
-- -7 released before.
local function pf_frozen_order(orders, tt_arg, order_arg)
  local tt = pf_int(tt_arg, 0, 2147483647)
  local order = pf_id(order_arg)
  if not tt or not order then return nil, -4 end
  local rec = redis.call('HGET', orders, order)
  if not rec then return nil, -8 end
  local s, t, b, q, u = pf_rec_parse(rec)
  if not s or t ~= tt then return nil, -4 end
  if s == 'C' then return nil, -6 end
  if s == 'R' then return nil, -7 end
  return {order = order, tt = t, b = b, q = q, u = u}
end

-- Tickets still available in bucket 'i' of the stock hash 'kstock'.
local function pf_avail(kstock, i)
  local v = redis.call('HMGET', kstock, 'stock:' .. i, 'frozen:' .. i, 'sold:' .. i)
  return pf_num(v[1]) - pf_num(v[2]) - pf_num(v[3])
end

-- First bucket to try for 'order' (a canonical id string): the order id
-- modulo n, from its last 9 digits (exact in a double, and spread as well).
local function pf_start(order, n)
  return tonumber(string.sub(order, -9)) % n
end

-- Record a successful freeze of 'qty' tickets of bucket 'b'.
local function pf_commit_freeze(k, tt, b, user, order, qty, deadline)
  redis.call('HINCRBY', k.stock, 'frozen:' .. b, qty)
  redis.call('HINCRBY', k.bought, user, qty)
  redis.call('HSET', k.orders, order, pf_rec('F', tt, b, qty, user))
  redis.call('ZADD', k.expiry, deadline, order)
end

-- Give a frozen order's tickets back: frozen count of its bucket and the
-- user's count go down, the record becomes R, the deadline goes.
local function pf_release_rec(k, order, b, qty, user, tt)
  redis.call('HINCRBY', k.stock, 'frozen:' .. b, -qty)
  if redis.call('HINCRBY', k.bought, user, -qty) <= 0 then
    redis.call('HDEL', k.bought, user)
  end
  redis.call('HSET', k.orders, order, pf_rec('R', tt, b, qty, user))
  redis.call('ZREM', k.expiry, order)
end

-- The order ids ARGV[from ..], canonical, for a fill: nil if one is not an
-- id, repeats another, or already has a record in k.orders (a served order
-- must be new).
local function pf_new_ids(k, from)
  local ids, seen = {}, {}
  for i = from, #ARGV do
    local id = pf_id(ARGV[i])
    if not id or seen[id] or redis.call('HEXISTS', k.orders, id) == 1 then return nil end
    seen[id] = true
    ids[#ids + 1] = id
  end
  return ids
end

-- Serve the waitlist of ticket type 'tt' (n buckets) in arrival order, each
-- user through the same freeze as freeze.lua, using the order ids 'ids' in
-- turn; 'limit' is the activity's per-user limit.  The reply of
-- waitlist_fill.lua and stock_add.lua (a flat array, four entries per user
-- handled: user id, order id, quantity, bucket; see waitlist_fill.lua).
local function pf_waitlist_serve(k, tt, deadline, max_scan, max_out, ids, n, limit)
  -- Available tickets per bucket, read once and kept up to date here.
  local avail, best = {}, 0
  for b = 0, n - 1 do
    avail[b] = pf_avail(k.stock, b)
    if avail[b] > best then best = avail[b] end
  end

  local out, next_id = {}, 1
  local function leave(user)
    redis.call('ZREM', k.wl, user)
    redis.call('HDEL', k.wlq, user)
  end
  local users = redis.call('ZRANGE', k.wl, 0, max_scan - 1)
  for _, user in ipairs(users) do
    if #out >= 4 * max_out or next_id > #ids or best <= 0 then break end
    local qty = pf_qty(redis.call('HGET', k.wlq, user) or '')
    if not qty or not pf_id(user) then
      leave(user)
      out[#out + 1] = user; out[#out + 1] = '0'; out[#out + 1] = qty or 0; out[#out + 1] = -4
    elseif pf_num(redis.call('HGET', k.bought, user)) + qty > limit then
      leave(user)
      out[#out + 1] = user; out[#out + 1] = '0'; out[#out + 1] = qty; out[#out + 1] = -2
    elseif qty <= best then
      local order = ids[next_id]
      local start = pf_start(order, n)
      for j = 0, n - 1 do
        local b = (start + j) % n
        if avail[b] >= qty then
          next_id = next_id + 1
          pf_commit_freeze(k, tt, b, user, order, qty, deadline)
          leave(user)
          avail[b] = avail[b] - qty
          out[#out + 1] = user; out[#out + 1] = order; out[#out + 1] = qty; out[#out + 1] = b
          break
        end
      end
      best = 0
      for b = 0, n - 1 do
        if avail[b] > best then best = avail[b] end
      end
    end
  end
  return out
end
