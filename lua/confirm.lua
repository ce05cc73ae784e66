-- confirm.lua - payment succeeded: the order's frozen tickets become sold,
-- exactly once per order.
--
-- KEYS[1] {act_A}:t<T>:stock   KEYS[2] {act_A}:orders
-- KEYS[3] {act_A}:t<T>:expiry  KEYS[4] {act_A}:meta (only its hold is read)
-- ARGV[1] ticket type T        ARGV[2] order id
--
-- Returns 0 (confirmed now: frozen:B -= Q, sold:B += Q, record F -> C, the
-- deadline removed; the user's count is unchanged: sold tickets still count
-- toward the limit), or
--   -4 bad arguments (also: the order belongs to another ticket type)
--   -6 already confirmed (no-op)
--   -7 already released (no-op: a release or expiry came first and won)
--   -8 unknown order (never frozen here)
--   -9 held (pf_held): nothing changed
-- Confirm and release of one order race safely: the first to run wins, the
-- other sees the record and answers -6/-7 without changing anything.
--
-- Cluster: every key is passed in KEYS and carries the tag {act_A}.

--#include stock_lib.lua

if #KEYS ~= 4 or #ARGV ~= 2 then return -4 end
local k = {stock = KEYS[1], orders = KEYS[2], expiry = KEYS[3], meta = KEYS[4]}
local f, answer = pf_frozen_order(k.orders, ARGV[1], ARGV[2])
if not f then return answer end
if pf_held(redis.call('HGET', k.meta, 'hold')) then return -9 end
redis.call('HINCRBY', k.stock, 'frozen:' .. f.b, -f.q)
redis.call('HINCRBY', k.stock, 'sold:' .. f.b, f.q)
redis.call('HSET', k.orders, f.order, pf_rec('C', f.tt, f.b, f.q, f.u))
redis.call('ZREM', k.expiry, f.order)
return 0
