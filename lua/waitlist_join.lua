-- waitlist_join.lua - put a user on the waitlist of one ticket type: first
-- come, first served, one entry per user.
--
-- KEYS[1] {act_A}:meta         KEYS[2] {act_A}:bought
-- KEYS[3] {act_A}:t<T>:wl      KEYS[4] {act_A}:t<T>:wlq
-- KEYS[5] {act_A}:t<T>:wlseq
-- ARGV[1] user id              ARGV[2] quantity wanted (1 .. 10000)
--
-- Returns an array {joined, position}: joined is 1 when the user was added
-- now and 0 when the user was already waiting (the first entry and its
-- quantity stay: joining twice changes nothing); position counts from 0
-- (0 = next to be served).  Or an integer:
--   -2 over limit (the user's tickets + qty > limit: could never be served)
--   -4 bad arguments
--   -5 activity not loaded
-- The arrival order is a counter (INCR of KEYS[5]) used as the zset score,
-- so equal clock readings cannot reorder users.
--
-- Cluster: every key is passed in KEYS and carries the tag {act_A}.

--#include stock_lib.lua

if #KEYS ~= 5 or #ARGV ~= 2 then return -4 end
local user = pf_id(ARGV[1])
local qty = pf_qty(ARGV[2])
if not user or not qty then return -4 end
local k = {meta = KEYS[1], bought = KEYS[2], wl = KEYS[3], wlq = KEYS[4], seq = KEYS[5]}

local meta = redis.call('HMGET', k.meta, 'status', 'limit')
if not meta[1] then return -5 end
if redis.call('ZSCORE', k.wl, user) then
  return {0, redis.call('ZRANK', k.wl, user)}
end
if pf_num(redis.call('HGET', k.bought, user)) + qty > pf_num(meta[2]) then return -2 end
redis.call('ZADD', k.wl, redis.call('INCR', k.seq), user)
redis.call('HSET', k.wlq, user, qty)
return {1, redis.call('ZRANK', k.wl, user)}
