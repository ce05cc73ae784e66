-- release.lua - the order was cancelled (or expired): its frozen tickets go
-- back to the bucket and the user's count goes down, exactly once per order.
--
-- KEYS[1] {act_A}:t<T>:stock   KEYS[2] {act_A}:bought
-- KEYS[3] {act_A}:orders       KEYS[4] {act_A}:t<T>:expiry
-- ARGV[1] ticket type T        ARGV[2] order id
--
-- Returns 0 (released now: frozen:B -= Q, the user's count -= Q (the field
-- is deleted at 0), record F -> R, the deadline removed), or
--   -4 bad arguments (also: the order belongs to another ticket type)
--   -6 already confirmed (no-op: payment came first and won)
--   -7 already released (no-op)
--   -8 unknown order
--
-- Cluster: every key is passed in KEYS and carries the tag {act_A}.

--#include stock_lib.lua

if #KEYS ~= 4 or #ARGV ~= 2 then return -4 end
local tt = pf_int(ARGV[1], 0, 2147483647)
local order = pf_id(ARGV[2])
if not tt or not order then return -4 end
local k = {stock = KEYS[1], bought = KEYS[2], orders = KEYS[3], expiry = KEYS[4]}

local rec = redis.call('HGET', k.orders, order)
if not rec then return -8 end
local s, t, b, q, u = pf_rec_parse(rec)
if not s or t ~= tt then return -4 end
if s == 'C' then return -6 end
if s == 'R' then return -7 end
pf_release_rec(k, order, b, q, u, t)
return 0
