-- waitlist_fill.lua - stock came back: serve waiting users of one ticket
-- type in arrival order, each through the same freeze as freeze.lua.
--
-- KEYS[1] {act_A}:meta         KEYS[2] {act_A}:t<T>:stock
-- KEYS[3] {act_A}:bought       KEYS[4] {act_A}:orders
-- KEYS[5] {act_A}:t<T>:expiry  KEYS[6] {act_A}:t<T>:wl
-- KEYS[7] {act_A}:t<T>:wlq
-- ARGV[1] ticket type T
-- ARGV[2] deadline of the freezes made, unix milliseconds
-- ARGV[3] most waitlist entries to look at (1 .. 10000)
-- ARGV[4] most entries to return (1 .. 10000)
-- ARGV[5..] order ids for the users served, used in this order (1 .. 1000
--         of them; each must be new: an id that already has a record, or
--         appears twice, is -4 and nothing changes)
--
-- Returns a flat array, four entries per user handled, in waitlist order:
--   user id, order id, quantity, bucket
-- where bucket >= 0: served (frozen like freeze.lua, with the order id
-- given: the caller creates that order), and the user left the waitlist;
-- bucket -2: the user's limit no longer fits the quantity: removed from the
-- waitlist, order id "0"; bucket -4: a damaged entry, removed, order id "0".
-- Users whose quantity fits no bucket now are skipped and keep their place
-- (a later, smaller request may be served before them).  Stops when the
-- order ids, the entries to look at or the results run out, or no bucket
-- has a ticket left.  Or an integer: -1 not on sale, -4 bad arguments,
-- -5 not loaded, -9 held (pf_held: nothing changed).
--
-- Cluster: every key is passed in KEYS and carries the tag {act_A}.

--#include stock_lib.lua

if #KEYS ~= 7 or #ARGV < 5 or #ARGV > 1004 then return -4 end
local tt = pf_int(ARGV[1], 0, 2147483647)
local deadline = pf_int(ARGV[2], 0, 9007199254740991)
local max_scan = pf_int(ARGV[3], 1, 10000)
local max_out = pf_int(ARGV[4], 1, 10000)
if not tt or not deadline or not max_scan or not max_out then return -4 end
local k = {meta = KEYS[1], stock = KEYS[2], bought = KEYS[3], orders = KEYS[4],
           expiry = KEYS[5], wl = KEYS[6], wlq = KEYS[7]}
local ids = pf_new_ids(k, 5)
if not ids then return -4 end

local meta = redis.call('HMGET', k.meta, 'status', 'limit', 'starts', 'ends', 'hold')
if not meta[1] then return -5 end
if pf_held(meta[5]) then return -9 end
if not pf_on_sale(meta[1], meta[3], meta[4]) then return -1 end
local n = pf_num(redis.call('HGET', k.stock, 'n'))
if n < 1 then return -5 end
return pf_waitlist_serve(k, tt, deadline, max_scan, max_out, ids, n, pf_num(meta[2]))
