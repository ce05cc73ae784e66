-- stock_add.lua - more tickets of one ticket type (an organiser added stock
-- to PostgreSQL): raise Redis's stock to PostgreSQL's and, in the same
-- atomic step, serve the waitlist from the new tickets first, before any
-- other buyer can take them.
--
-- KEYS[1] {act_A}:meta         KEYS[2] {act_A}:t<T>:stock
-- KEYS[3] {act_A}:bought       KEYS[4] {act_A}:orders
-- KEYS[5] {act_A}:t<T>:expiry  KEYS[6] {act_A}:t<T>:wl
-- KEYS[7] {act_A}:t<T>:wlq
-- ARGV[1] ticket type T
-- ARGV[2] deadline of the freezes made, unix milliseconds
-- ARGV[3] most waitlist entries to look at (1 .. 10000)
-- ARGV[4] most entries to return (1 .. 10000)
-- ARGV[5] m, the number of buckets given (1 .. 100000)
-- ARGV[6 .. 5+m] the stock of buckets 0 .. m-1 in PostgreSQL after the
--         addition (0 .. 2^31-1): stock:i becomes the greater of this and
--         its value in Redis.  Stock only ever grows, so a raise is
--         idempotent and two additions applied out of order end where
--         PostgreSQL is; n becomes m when m is greater.
-- ARGV[6+m ..] order ids for the users served (0 .. 1000 of them, each
--         new, as for waitlist_fill.lua; none: raise only)
--
-- Returns waitlist_fill.lua's flat array (four entries per user handled;
-- empty when the sale is not open now: the stock is raised all the same),
-- or an integer: -4 bad arguments, -5 not loaded (no meta hash: nothing is
-- raised, the seed copies PostgreSQL's stock when the activity is loaded),
-- -9 held (pf_held: nothing changed).
--
-- Cluster: every key is passed in KEYS and carries the tag {act_A}.

--#include stock_lib.lua

if #KEYS ~= 7 or #ARGV < 6 then return -4 end
local tt = pf_int(ARGV[1], 0, 2147483647)
local deadline = pf_int(ARGV[2], 0, 9007199254740991)
local max_scan = pf_int(ARGV[3], 1, 10000)
local max_out = pf_int(ARGV[4], 1, 10000)
local m = pf_int(ARGV[5], 1, 100000)
if not tt or not deadline or not max_scan or not max_out or not m then return -4 end
if #ARGV < 5 + m or #ARGV > 5 + m + 1000 then return -4 end
local k = {meta = KEYS[1], stock = KEYS[2], bought = KEYS[3], orders = KEYS[4],
           expiry = KEYS[5], wl = KEYS[6], wlq = KEYS[7]}
local stocks = {}
for b = 0, m - 1 do
  stocks[b] = pf_int(ARGV[6 + b], 0, 2147483647)
  if not stocks[b] then return -4 end
end
local ids = pf_new_ids(k, 6 + m)
if not ids then return -4 end

local meta = redis.call('HMGET', k.meta, 'status', 'limit', 'starts', 'ends', 'hold')
if not meta[1] then return -5 end
if pf_held(meta[5]) then return -9 end
for b = 0, m - 1 do
  if stocks[b] > pf_num(redis.call('HGET', k.stock, 'stock:' .. b)) then
    redis.call('HSET', k.stock, 'stock:' .. b, stocks[b])
  end
end
local n = pf_num(redis.call('HGET', k.stock, 'n'))
if m > n then
  n = m
  redis.call('HSET', k.stock, 'n', n)
end
if #ids == 0 or not pf_on_sale(meta[1], meta[3], meta[4]) then return {} end
return pf_waitlist_serve(k, tt, deadline, max_scan, max_out, ids, n, pf_num(meta[2]))
