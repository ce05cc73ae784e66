-- hold.lua - librmclient's reconciliation holds one activity's writers for
-- a moment, so that its next WATCHed round is not aborted by the sale.
--
-- KEYS[1] {act_A}:meta
-- ARGV[1] how long, milliseconds (1 .. 10000)
--
-- Returns 1: meta's field 'hold' is now the Redis server's clock +
-- ARGV[1] (unix ms); 0: the activity is not loaded (no meta hash: the
-- writers answer -5 then and write nothing, so there is nothing to hold),
-- nothing changed; -4: bad arguments, nothing changed.  While the hold lasts
-- every script that writes the activity's watched keys answers -9 and
-- changes nothing (stock_lib.lua, pf_held); the round that succeeds deletes
-- the field in its MULTI/EXEC, and a hold whose reconciler died ends by
-- itself at its deadline.  The server's clock, so that every writer and
-- every reconciler agree on when it ends.
--
-- Cluster: the one key carries the tag {act_A}.

--#include stock_lib.lua

if #KEYS ~= 1 or #ARGV ~= 1 then return -4 end
local ms = pf_int(ARGV[1], 1, 10000)
if not ms then return -4 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'hold', pf_now() + ms)
return 1
