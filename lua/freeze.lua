-- freeze.lua - the prefilter: freeze 'qty' tickets of one ticket type for
-- one order, atomically, or say why not.
--
-- KEYS[1] {act_A}:meta        KEYS[2] {act_A}:t<T>:stock
-- KEYS[3] {act_A}:bought      KEYS[4] {act_A}:orders
-- KEYS[5] {act_A}:t<T>:expiry
-- KEYS[6] {act_A}:queue       (optional: the queued order mode) a stream;
--         a new freeze adds the entry that carries its order to the
--         consumer that creates it: fields order, user, tt, qty, bucket,
--         deadline (and key, when ARGV[6] is given).  In the same script,
--         so that a freeze exists exactly when its order is queued (a
--         repeat adds nothing).
-- ARGV[1] ticket type T (0 .. 2^31-1)
-- ARGV[2] user id            ARGV[3] order id
-- ARGV[4] quantity (1 .. 10000)
-- ARGV[5] deadline of the freeze, unix milliseconds (the expiry sweep
--         releases the order after it unless it was confirmed)
-- ARGV[6] (only with KEYS[6], optional) the request's idempotency key,
--         1 .. 64 of A-Za-z0-9._:-, carried in the queue entry
--
-- Returns the bucket frozen (>= 0), or
--   -1 not on sale (meta status is not 1, or the Redis server's clock is
--      outside the window starts .. ends when meta has it: pf_on_sale)
--   -2 over limit (user's tickets + qty > limit)
--   -3 sold out (no bucket has qty available)
--   -4 bad arguments (wrong number of keys or arguments, a value out of
--      range or not a decimal integer; also a second freeze of an order id
--      with another user, ticket type or quantity)
--   -5 activity not loaded (no meta hash, or no buckets for T)
--   -6 / -7 this order was already frozen and since confirmed / released
--   -9 held (pf_held): the reconciliation holds the activity; nothing changed
-- Nothing changes unless a bucket is returned.
--
-- Order of checks: arguments, the hold, status, an existing record of the
-- order (a retry of the same freeze returns the same bucket: safe to
-- repeat after a lost answer), the user's limit, then the buckets:
-- available = stock - frozen - sold, starting at bucket (order id mod n)
-- and trying the others in turn.  On success: frozen:B += qty, the user's
-- count += qty, the order record "F:T:B:Q:U" is written and its deadline
-- added to the expiry zset.
--
-- Cluster: every key is passed in KEYS and carries the tag {act_A}.

--#include stock_lib.lua

if not ((#KEYS == 5 and #ARGV == 5) or (#KEYS == 6 and (#ARGV == 5 or #ARGV == 6))) then return -4 end
local idem = ARGV[6]
if idem and (#idem > 64 or not string.match(idem, '^[%w%._:%-]+$')) then return -4 end
local tt = pf_int(ARGV[1], 0, 2147483647)
local user = pf_id(ARGV[2])
local order = pf_id(ARGV[3])
local qty = pf_qty(ARGV[4])
local deadline = pf_int(ARGV[5], 0, 9007199254740991)
if not tt or not user or not order or not qty or not deadline then return -4 end
local k = {meta = KEYS[1], stock = KEYS[2], bought = KEYS[3], orders = KEYS[4], expiry = KEYS[5],
           queue = KEYS[6]}

local meta = redis.call('HMGET', k.meta, 'status', 'limit', 'starts', 'ends', 'hold')
if not meta[1] then return -5 end
if pf_held(meta[5]) then return -9 end
if not pf_on_sale(meta[1], meta[3], meta[4]) then return -1 end

local rec = redis.call('HGET', k.orders, order)
if rec then return pf_replay(rec, tt, user, qty) end

local limit = pf_num(meta[2])
if pf_num(redis.call('HGET', k.bought, user)) + qty > limit then return -2 end

local n = pf_num(redis.call('HGET', k.stock, 'n'))
if n < 1 then return -5 end
local start = pf_start(order, n)
for j = 0, n - 1 do
  local b = (start + j) % n
  if pf_avail(k.stock, b) >= qty then
    pf_commit_freeze(k, tt, b, user, order, qty, deadline)
    if k.queue then
      if idem then
        redis.call('XADD', k.queue, '*', 'order', order, 'user', user, 'tt', tt, 'qty', qty, 'bucket', b,
                   'deadline', deadline, 'key', idem)
      else
        redis.call('XADD', k.queue, '*', 'order', order, 'user', user, 'tt', tt, 'qty', qty, 'bucket', b,
                   'deadline', deadline)
      end
    end
    return b
  end
end
return -3
