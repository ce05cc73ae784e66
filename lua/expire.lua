-- expire.lua - the Redis half of the expiry sweep: release frozen orders of
-- one ticket type whose deadline has passed, oldest first, exactly once.
--
-- KEYS[1] {act_A}:t<T>:stock   KEYS[2] {act_A}:bought
-- KEYS[3] {act_A}:orders       KEYS[4] {act_A}:t<T>:expiry
-- KEYS[5] {act_A}:meta (only its hold is read)
-- ARGV[1] ticket type T
-- ARGV[2] now, unix milliseconds: deadlines <= now are due
-- ARGV[3] most orders to release in this call (1 .. 10000)
--
-- Returns a flat array, four entries per released order:
--   order id (string), user id (string), quantity, bucket
-- or the integer -4 (bad arguments) or -9 (held, pf_held: nothing
-- changed).  Each due entry is taken out of the expiry zset; entries whose
-- order is no longer frozen (confirmed or released meanwhile, or without a
-- record) are dropped silently.  Release is the same as release.lua's, so
-- an order is released once whichever of the two runs first.
--
-- librmclient runs this script alone when it has no PostgreSQL store; with
-- one, PostgreSQL decides each due order first (rm_prefilter_expire).
--
-- Cluster: every key is passed in KEYS and carries the tag {act_A}.

--#include stock_lib.lua

if #KEYS ~= 5 or #ARGV ~= 3 then return -4 end
local tt = pf_int(ARGV[1], 0, 2147483647)
local now = pf_int(ARGV[2], 0, 9007199254740991)
local max = pf_int(ARGV[3], 1, 10000)
if not tt or not now or not max then return -4 end
local k = {stock = KEYS[1], bought = KEYS[2], orders = KEYS[3], expiry = KEYS[4], meta = KEYS[5]}
if pf_held(redis.call('HGET', k.meta, 'hold')) then return -9 end

local out = {}
local due = redis.call('ZRANGEBYSCORE', k.expiry, '-inf', now, 'LIMIT', 0, max)
for _, order in ipairs(due) do
  local s, t, b, q, u = pf_rec_parse(redis.call('HGET', k.orders, order))
  if s == 'F' and t == tt then
    pf_release_rec(k, order, b, q, u, t)
    out[#out + 1] = order
    out[#out + 1] = u
    out[#out + 1] = q
    out[#out + 1] = b
  else
    redis.call('ZREM', k.expiry, order)
  end
end
return out
