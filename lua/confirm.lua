-- confirm.lua - payment succeeded: the order's frozen tickets become sold,
-- exactly once per order.
--
-- KEYS[1] {act_A}:t<T>:stock   KEYS[2] {act_A}:orders
-- KEYS[3] {act_A}:t<T>:expiry
-- ARGV[1] ticket type T        ARGV[2] order id
--
-- Returns 0 (confirmed now: frozen:B -= Q, sold:B += Q, record F -> C, the
-- deadline removed; the user's count is unchanged: sold tickets still count
-- toward the limit), or
--   -4 bad arguments (also: the order belongs to another ticket type)
--   -6 already confirmed (no-op)
--   -7 already released (no-op: a release or expiry came first and won)
--   -8 unknown order (never frozen here)
-- Confirm and release of one order race safely: the first to run wins, the
-- other sees the record and answers -6/-7 without changing anything.
--
-- Cluster: every key is passed in KEYS and carries the tag {act_A}.

--#include stock_lib.lua

if #KEYS ~= 3 or #ARGV ~= 2 then return -4 end
local tt = pf_int(ARGV[1], 0, 2147483647)
local order = pf_id(ARGV[2])
if not tt or not order then return -4 end
local k = {stock = KEYS[1], orders = KEYS[2], expiry = KEYS[3]}

local rec = redis.call('HGET', k.orders, order)
if not rec then return -8 end
local s, t, b, q, u = pf_rec_parse(rec)
if not s or t ~= tt then return -4 end
if s == 'C' then return -6 end
if s == 'R' then return -7 end
redis.call('HINCRBY', k.stock, 'frozen:' .. b, -q)
redis.call('HINCRBY', k.stock, 'sold:' .. b, q)
redis.call('HSET', k.orders, order, pf_rec('C', t, b, q, u))
redis.call('ZREM', k.expiry, order)
return 0
