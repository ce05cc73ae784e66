-- sql/tc/018_generic_plans.sql - the store's batch functions keep one plan
-- per statement, whoever calls them, as tcd's writers always did
-- (coordinator database, version 18).
--
-- A statement in a PL/pgSQL function is a prepared statement of the
-- session.  Under the default plan_cache_mode (auto) PostgreSQL plans it
-- for each call's parameter values (a "custom" plan) as long as the
-- generic plan's estimated cost is above the custom plans' average, and
-- with an array parameter (every batch function's xid list) the generic
-- estimate is rarely lower: so the big statements of tc_decide_batch, of
-- tc__finish_many and of tc_decide_lock were planned at every call.
--
-- tcd's writers never paid that: their connections run with
-- plan_cache_mode = force_generic_plan for the whole session
-- (tc_store.c, the writers' init_sql).  Every other caller did:
-- bench/store-functions, whose per-batch figures therefore included
-- planning that tcd never does (one client, batches of one global,
-- twenty-fourth session, slower machine variant: tc_decide_batch 0.66 ms
-- with the planning, 0.42 ms without; rounds 397-407/s against
-- 467-501/s), an operator's psql, the tests.  Now the functions carry the
-- setting themselves, as they carry 017's enable_seqscan = off, so that
-- whoever calls them gets the plans tcd gets, and a change to the
-- writers' session settings cannot take them away.
--
-- A generic plan is made without the parameters' values, from the tables'
-- sizes; enable_seqscan = off keeps those plans on the keys
-- (test_schema.sh counts the sequential scans of a
-- begin-register-decide-report round on vacuumed-empty tables: none, and
-- checks that the functions keep both settings).  Like 017's, the setting
-- is the function's own, restored when it returns.
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
