-- sql/tc/018_generic_plans.sql - the store's batch functions keep one plan
-- per statement instead of planning it again at every call (coordinator
-- database, version 18).
--
-- A statement in a PL/pgSQL function is a prepared statement of the
-- session.  Under the default plan_cache_mode (auto) PostgreSQL plans it
-- for each call's parameter values (a "custom" plan) as long as the
-- generic plan's estimated cost is above the custom plans' average, and
-- with an array parameter (every batch function's xid list) the generic
-- estimate is rarely lower: so the big statements of tc_decide_batch, of
-- tc__finish_many and of tc_decide_lock were planned at every call.
-- Planning is CPU the statement's own work does not need: at a batch of
-- one global (a quiet coordinator, or a flash sale's first second on a
-- small machine) it was most of the call.  bench/store-functions, one
-- client, batches of one (twenty-fourth session, slower machine variant):
-- tc_decide_batch 0.66 -> 0.42 ms, tc_decide_lock 0.27-0.30 -> 0.19-0.21
-- ms, rounds 397-407 -> 467-501/s; batches of 11 at two clients: 734-821
-- -> 826-836 rounds/s.
--
-- A generic plan is made without the parameters' values, from the tables'
-- sizes; 017's enable_seqscan = off, the functions' own setting too, keeps
-- those plans on the keys (test_schema.sh counts the sequential scans of a
-- begin-register-decide-report round on vacuumed-empty tables: none).
-- Like 017's, the setting is the function's own (restored when it
-- returns), so nothing else in tcd's transaction is planned with it.
--
-- Never edit this file after it has shipped: add sql/tc/019_*.sql instead.

ALTER FUNCTION tc_begin_batch(text[], bigint[], integer[], text[], text[], text[], text[], integer)
  SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION tc_register_batch(text[], bigint[], text[], smallint[], text[], text[], text[], text[], text[], text[],
                                 integer[], text[], text[], text[])
  SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION tc_decide_lock(text[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION tc_decide_batch(text[], text[], text[], text[], integer) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION tc_phase2_batch(text[], bigint[], smallint[], text[], text[], text[], text[], integer, integer)
  SET plan_cache_mode = force_generic_plan;
