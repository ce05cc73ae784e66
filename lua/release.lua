-- release.lua - the order was cancelled (or expired): its frozen tickets go
-- back to the bucket and the user's count goes down, exactly once per order.
--
-- KEYS[1] {act_A}:t<T>:stock   KEYS[2] {act_A}:bought
-- KEYS[3] {act_A}:orders       KEYS[4] {act_A}:t<T>:expiry
-- KEYS[5] {act_A}:meta (only its hold is read)
-- ARGV[1] ticket type T        ARGV[2] order id
--
-- Returns 0 (released now: frozen:B -= Q, the user's count -= Q (the field
-- is deleted at 0), record F -> R, the deadline removed), or
--   -4 bad arguments (also: the order belongs to another ticket type)
--   -6 already confirmed (no-op: payment came first and won)
--   -7 already released (no-op)
--   -8 unknown order
--   -9 held (pf_held): nothing changed
--
-- Cluster: every key is passed in KEYS and carries the tag {act_A}.

--#include stock_lib.lua

if #KEYS ~= 5 or #ARGV ~= 2 then return -4 end
local k = {stock = KEYS[1], bought = KEYS[2], orders = KEYS[3], expiry = KEYS[4], meta = KEYS[5]}
local f, answer = pf_frozen_order(k.orders, ARGV[1], ARGV[2])
if not f then return answer end
if pf_held(redis.call('HGET', k.meta, 'hold')) then return -9 end
pf_release_rec(k, f.order, f.b, f.q, f.u, f.tt)
return 0
