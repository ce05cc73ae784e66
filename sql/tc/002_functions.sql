-- sql/tc/002_functions.sql - the coordinator's store operations, set-based.
--
-- NOTES
--   tcd batches the requests of many sessions into one PostgreSQL
--   transaction (group commit): each function below takes arrays (one
--   element per request, "item" 1..n) and returns one row per item, so a
--   batch of 200 registrations costs one round trip and one fsync, not 200.
--   The functions are set-based: a handful of statements per batch, never a
--   statement per item (a PL/pgSQL loop costs ~30 us per statement per
--   item, which made PostgreSQL's CPU the coordinator's ceiling).
--   Each item's outcome is a short word in "result" that tcd maps to its
--   protocol error codes (proto/txp_errno.h):
--     ok, not_found, not_active, timed_out, conflict, holder_rollbacking,
--     decided, finished, not_expired, branch_not_found, failed, retry.
--   Status numbers are Seata's (proto/txp_status.h):
--     global: 1 Begin, 4 Rollbacking, 5 RollbackRetrying, 6 TimeoutRollbacking,
--             7 TimeoutRollbackRetrying, 8 AsyncCommitting, 3 CommitRetrying,
--             9 Committed, 10 CommitFailed, 11 Rollbacked, 12 TimeoutRollbacked,
--             13 RollbackFailed, 14 TimeoutRollbackFailed
--     branch: 1 Registered, 2 PhaseOneDone, 3 PhaseOneFailed,
--             5 PhaseTwoCommitted, 6 ..CommitFailedRetryable, 7 ..Unretryable,
--             8 PhaseTwoRollbacked, 9 ..RollbackFailedRetryable, 10 ..Unretryable
--
--   Concurrency: every function first locks the global row it works on
--   (FOR SHARE to register, FOR UPDATE to decide or record phase two), so a
--   registration and a decision on the same xid are serialised: a branch can
--   never be added after the decision, and the decision is a compare-and-set
--   on status = 1 (Begin).  Under READ COMMITTED each statement takes a new
--   snapshot, so after waiting for a row lock a function sees what the
--   other transaction committed.

-- Ids come in blocks: block b owns [b * 4096, b * 4096 + 4095].  A node takes
-- a block with nextval() and hands out its ids from memory, so ids are unique
-- across the cluster without a round trip per id.
CREATE SEQUENCE tc_id_block_seq AS bigint START WITH 1 INCREMENT BY 1;
COMMENT ON SEQUENCE tc_id_block_seq IS
  'Blocks of 4096 ids (transaction and branch ids) reserved by tcd nodes.';

-- Move finished global transactions (with their branches) to history and
-- delete their rows: p_status[i] is the final status of p_xid[i].  With
-- p_branch_status, history records that status for every branch (the
-- commit fast path, which does not update the branch rows first).
CREATE FUNCTION tc__finish_many(p_xid text[], p_status smallint[],
                                p_branch_status smallint DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  -- One statement: every part sees the rows as they were before it, so
  -- history reads the branches that the same statement deletes.
  WITH hist AS (
    INSERT INTO global_history (xid, transaction_id, status, application_id, transaction_name,
                                begin_time, branches)
    SELECT g.xid, g.transaction_id, f.s, g.application_id, g.transaction_name, g.begin_time,
           coalesce(br.branches, '[]'::jsonb)
      FROM unnest(p_xid, p_status) AS f(x, s)
      JOIN global_table g ON g.xid = f.x
      LEFT JOIN LATERAL (
        SELECT jsonb_agg(jsonb_build_object('branch_id', b.branch_id, 'resource_id', b.resource_id,
                                            'branch_type', b.branch_type,
                                            'status', coalesce(p_branch_status, b.status))
                         ORDER BY b.branch_id) AS branches
          FROM branch_table b WHERE b.xid = g.xid) br ON true
    ON CONFLICT (xid) DO NOTHING),
  del_branches AS (DELETE FROM branch_table WHERE xid = ANY (p_xid)),
  del_locks AS (DELETE FROM lock_table WHERE xid = ANY (p_xid))
  DELETE FROM global_table WHERE xid = ANY (p_xid);
END $$;

-- GlobalBegin.  A repeated idempotency key returns the xid of the first
-- begin instead of creating a second transaction; 'finished' when that
-- first transaction has already ended (its key is no longer on file).
CREATE FUNCTION tc_begin_batch(p_xid text[], p_txid bigint[], p_timeout_ms int[],
                               p_name text[], p_app text[], p_idem text[], p_node int)
RETURNS TABLE (item int, xid text, result text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_inserted text[];
BEGIN
  WITH ins AS (
    INSERT INTO global_table (xid, transaction_id, status, application_id, transaction_name,
                              timeout_ms, deadline, node_id, idem_key)
    SELECT u.x, u.t, 1, u.a, u.n, u.ms, clock_timestamp() + u.ms * interval '1 millisecond',
           p_node, u.k
      FROM unnest(p_xid, p_txid, p_timeout_ms, p_name, p_app, p_idem) AS u(x, t, ms, n, a, k)
    ON CONFLICT (idem_key) DO NOTHING
    RETURNING global_table.xid)
  SELECT coalesce(array_agg(ins.xid), '{}') INTO v_inserted FROM ins;

  IF cardinality(v_inserted) = cardinality(p_xid) THEN
    RETURN QUERY SELECT u.i::int, u.x, 'ok'::text
                   FROM unnest(p_xid) WITH ORDINALITY AS u(x, i) ORDER BY u.i;
    RETURN;
  END IF;
  -- Items not inserted repeated an idempotency key: answer the first xid.
  -- (A new statement: it sees the rows of a concurrent begin that the
  -- insert waited for.)
  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN u.x = ANY (v_inserted) THEN u.x ELSE g.xid END,
         CASE WHEN u.x = ANY (v_inserted) OR g.xid IS NOT NULL THEN 'ok' ELSE 'finished' END
    FROM unnest(p_xid, p_idem) WITH ORDINALITY AS u(x, k, i)
    LEFT JOIN global_table g ON NOT (u.x = ANY (v_inserted)) AND g.idem_key = u.k
   ORDER BY u.i;
END $$;

-- BranchRegister.  Lock rows (l_*: flattened, l_item says which item each
-- belongs to).  A key held by another xid is a conflict: the keys the item
-- took are given back and nothing else changes.  The same xid taking a key
-- it already holds is fine.  Only while Begin and before the deadline.
CREATE FUNCTION tc_register_batch(p_xid text[], p_branch bigint[], p_resource text[],
                                  p_type smallint[], p_lock_keys text[], p_app_data text[],
                                  p_client text[], p_idem text[],
                                  l_item int[], l_row text[], l_table text[], l_pk text[])
RETURNS TABLE (item int, result text, branch_id bigint, holder text, holder_status smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_active int[];     -- items whose global is Begin and not past its deadline
  v_dup int[];        -- items repeating an idempotency key: v_dup_branch[k] is theirs
  v_dup_branch bigint[];
  v_conflict int[];   -- items that met a key held by another xid
  v_holder text[];
  v_holder_status smallint[];
BEGIN
  -- 1. Share-lock the globals (in xid order): a decision cannot slip in
  --    between this check and the inserts below.
  SELECT coalesce(array_agg(u.i::int), '{}') INTO v_active
    FROM unnest(p_xid) WITH ORDINALITY AS u(x, i)
    JOIN (SELECT gt.xid, gt.status, gt.deadline FROM global_table gt
           WHERE gt.xid = ANY (p_xid) ORDER BY gt.xid FOR SHARE) g ON g.xid = u.x
   WHERE g.status = 1 AND g.deadline >= clock_timestamp();

  -- 2. Repeated idempotency keys (none to look for when no item has one).
  v_dup := '{}';
  v_dup_branch := '{}';
  IF cardinality(array_remove(p_idem, NULL)) > 0 THEN
    SELECT coalesce(array_agg(u.i::int), '{}'), coalesce(array_agg(b.branch_id), '{}')
      INTO v_dup, v_dup_branch
      FROM unnest(p_xid, p_idem) WITH ORDINALITY AS u(x, k, i)
      JOIN branch_table b ON b.xid = u.x AND b.idem_key = u.k
     WHERE u.i = ANY (v_active);
  END IF;

  v_conflict := '{}';
  -- 3. Locks, in row_key order (then queue order), which keeps concurrent
  --    batches from deadlocking and gives a contended key to the item that
  --    queued first.
  IF cardinality(l_item) > 0 THEN
  --    One statement: the insert, then (4.) the conflicts: a wanted key that
  --    this item did not insert and whose row belongs to another xid.  The
  --    outer query sees the rows as they were before the insert; a key taken
  --    meanwhile by a concurrent batch (the insert waited for it) or by
  --    another item of this batch shows no row there: that item conflicts
  --    with an empty holder and tcd retries it at once, when the holder is
  --    visible.
  WITH ins AS (
    INSERT INTO lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk)
    SELECT l.r, p_xid[l.it], gt.transaction_id, p_branch[l.it], p_resource[l.it], l.t, l.p
      FROM unnest(l_item, l_row, l_table, l_pk) AS l(it, r, t, p)
      JOIN global_table gt ON gt.xid = p_xid[l.it]
     WHERE l.it = ANY (v_active) AND NOT (l.it = ANY (v_dup))
     ORDER BY l.r, l.it
    ON CONFLICT (row_key) DO NOTHING
    RETURNING lock_table.row_key, lock_table.branch_id)
  SELECT coalesce(array_agg(c.it), '{}'), coalesce(array_agg(c.hx), '{}'),
         coalesce(array_agg(c.hs), '{}')
    INTO v_conflict, v_holder, v_holder_status
    FROM (SELECT DISTINCT ON (l.it) l.it, lt.xid AS hx, lt.status AS hs
            FROM unnest(l_item, l_row) AS l(it, r)
            LEFT JOIN ins ON ins.row_key = l.r AND ins.branch_id = p_branch[l.it]
            LEFT JOIN lock_table lt ON lt.row_key = l.r
           WHERE l.it = ANY (v_active) AND NOT (l.it = ANY (v_dup))
             AND ins.row_key IS NULL
             AND (lt.xid IS NULL OR lt.xid <> p_xid[l.it])
           ORDER BY l.it, lt.status DESC NULLS LAST) c;

  -- 5. A conflicting item gives back the keys it took.
  IF cardinality(v_conflict) > 0 THEN
    DELETE FROM lock_table lt
     WHERE lt.branch_id = ANY (SELECT p_branch[c] FROM unnest(v_conflict) AS c);
  END IF;
  END IF;

  -- 6. Branch rows of the items that got all their keys.
  INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, branch_type, status,
                            lock_keys, application_data, client_id, idem_key)
  SELECT u.b, u.x, gt.transaction_id, u.r, u.ty, 1, u.lk, u.ad, u.cl, u.k
    FROM unnest(p_xid, p_branch, p_resource, p_type, p_lock_keys, p_app_data, p_client, p_idem)
         WITH ORDINALITY AS u(x, b, r, ty, lk, ad, cl, k, i)
    JOIN global_table gt ON gt.xid = u.x
   WHERE u.i = ANY (v_active) AND NOT (u.i = ANY (v_dup)) AND NOT (u.i = ANY (v_conflict));

  -- 7. One row per item; from memory in the usual case (every item was
  --    active and got its keys).
  IF cardinality(v_active) = cardinality(p_xid) AND cardinality(v_dup) = 0
     AND cardinality(v_conflict) = 0 THEN
    RETURN QUERY SELECT u.i::int, 'ok'::text, u.b, NULL::text, NULL::smallint
                   FROM unnest(p_branch) WITH ORDINALITY AS u(b, i) ORDER BY u.i;
    RETURN;
  END IF;
  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN gt.xid IS NULL THEN 'not_found'
              WHEN NOT (u.i = ANY (v_active)) AND gt.status <> 1 THEN 'not_active'
              WHEN NOT (u.i = ANY (v_active)) THEN 'timed_out'
              WHEN u.i = ANY (v_dup) THEN 'ok'
              WHEN u.i = ANY (v_conflict) THEN
                CASE WHEN v_holder_status[array_position(v_conflict, u.i::int)] = 1
                     THEN 'holder_rollbacking' ELSE 'conflict' END
              ELSE 'ok' END,
         CASE WHEN u.i = ANY (v_dup) THEN v_dup_branch[array_position(v_dup, u.i::int)]
              WHEN u.i = ANY (v_active) AND NOT (u.i = ANY (v_conflict)) THEN u.b END,
         CASE WHEN u.i = ANY (v_conflict) THEN v_holder[array_position(v_conflict, u.i::int)] END,
         CASE WHEN u.i = ANY (v_conflict) THEN v_holder_status[array_position(v_conflict, u.i::int)]
              WHEN NOT (u.i = ANY (v_active)) THEN gt.status END
    FROM unnest(p_xid, p_branch) WITH ORDINALITY AS u(x, b, i)
    LEFT JOIN global_table gt ON gt.xid = u.x
   ORDER BY u.i;
END $$;

-- The decision: p_action[i] is 'commit', 'rollback' (TM) or 'timeout'
-- (timeout job).  A compare-and-set from Begin; a commit past the deadline
-- becomes a timeout rollback.  Commit releases the global locks at once
-- (AT: the data is already committed locally); rollback marks them
-- rollbacking (status 1) and keeps them until the undo is done.  A
-- transaction without branches is finished on the spot.  p_lease_ms keeps
-- the leader's retry job away while the deciding node drives phase two.
CREATE FUNCTION tc_decide_batch(p_xid text[], p_action text[], p_lease_ms int)
RETURNS TABLE (item int, result text, status smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_items int[];      -- the item that decided each xid
  v_status smallint[];-- the status it set
  v_branches boolean[];
  v_timed_out boolean[];
BEGIN
  -- Lock first, in a statement of its own: the next statement's snapshot
  -- then includes every branch registered by a transaction this one waited
  -- for (a snapshot taken before the wait would miss it, and the decision
  -- would finish a transaction that has a branch).
  PERFORM 1 FROM global_table gt WHERE gt.xid = ANY (p_xid) ORDER BY gt.xid FOR UPDATE;

  -- One deciding item per xid: a TM's commit/rollback before the timeout
  -- job's; among equals the first queued.  The rest report the outcome.
  WITH firsts AS (
    SELECT DISTINCT ON (u.x) u.x, u.a, u.i::int AS i
      FROM unnest(p_xid, p_action) WITH ORDINALITY AS u(x, a, i)
     ORDER BY u.x, (u.a = 'timeout'), u.i),
  plan AS (
    SELECT f.x, f.i, (f.a = 'commit' AND g.deadline < clock_timestamp()) AS late,
           CASE WHEN f.a = 'commit' AND g.deadline < clock_timestamp() THEN 'timeout'
                ELSE f.a END AS act,
           EXISTS (SELECT 1 FROM branch_table b WHERE b.xid = f.x) AS has_branches
      FROM firsts f JOIN global_table g ON g.xid = f.x
     WHERE g.status = 1 AND (f.a <> 'timeout' OR g.deadline < clock_timestamp())),
  upd AS (
    UPDATE global_table g
       SET status = CASE WHEN p.has_branches THEN
                      CASE p.act WHEN 'commit' THEN 8 WHEN 'rollback' THEN 4 ELSE 6 END
                    ELSE CASE p.act WHEN 'commit' THEN 9 WHEN 'rollback' THEN 11 ELSE 12 END END,
           gmt_modified = clock_timestamp(),
           next_retry_at = CASE WHEN p.has_branches
                                THEN clock_timestamp() + p_lease_ms * interval '1 millisecond' END
      FROM plan p
     WHERE g.xid = p.x AND g.status = 1
    RETURNING p.i, g.status, p.has_branches, p.late)
  SELECT coalesce(array_agg(upd.i), '{}'), coalesce(array_agg(upd.status), '{}'),
         coalesce(array_agg(upd.has_branches), '{}'), coalesce(array_agg(upd.late), '{}')
    INTO v_items, v_status, v_branches, v_timed_out
    FROM upd;

  -- Commit releases the locks now; rollback marks them rollbacking.  (Each
  -- statement only when it has work: the common batch is all commits.)
  IF 8 = ANY (v_status) THEN
    DELETE FROM lock_table lt
     WHERE lt.xid = ANY (SELECT p_xid[d.i] FROM unnest(v_items, v_status) AS d(i, s) WHERE d.s = 8);
  END IF;
  IF 4 = ANY (v_status) OR 6 = ANY (v_status) THEN
    UPDATE lock_table lt SET status = 1
     WHERE lt.xid = ANY (SELECT p_xid[d.i] FROM unnest(v_items, v_status) AS d(i, s) WHERE d.s IN (4, 6));
  END IF;
  -- Without branches there is nothing to drive: finished now.
  IF false = ANY (v_branches) THEN
    PERFORM tc__finish_many(array_agg(p_xid[d.i]), array_agg(d.s))
       FROM unnest(v_items, v_status, v_branches) AS d(i, s, hb) WHERE NOT d.hb;
  END IF;

  IF cardinality(v_items) = cardinality(p_xid) THEN
    -- Every item decided its own xid (the usual case): answer from memory.
    RETURN QUERY
    SELECT d.i, CASE WHEN d.late THEN 'timed_out' ELSE 'ok' END, d.s
      FROM unnest(v_items, v_status, v_timed_out) AS d(i, s, late) ORDER BY d.i;
    RETURN;
  END IF;
  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN u.i = ANY (v_items) THEN
                CASE WHEN v_timed_out[array_position(v_items, u.i::int)] THEN 'timed_out' ELSE 'ok' END
              WHEN g.status = 1 THEN 'not_expired'
              WHEN g.xid IS NOT NULL THEN 'decided'
              WHEN h.xid IS NOT NULL THEN 'finished'
              ELSE 'not_found' END,
         CASE WHEN u.i = ANY (v_items) THEN v_status[array_position(v_items, u.i::int)]
              ELSE coalesce(g.status, h.status, 0::smallint) END
    FROM unnest(p_xid) WITH ORDINALITY AS u(x, i)
    LEFT JOIN global_table g ON g.xid = u.x
    LEFT JOIN global_history h ON g.xid IS NULL AND h.xid = u.x
   ORDER BY u.i;
END $$;

-- Phase-two outcomes of branches (and phase-one reports of RMs).  Done
-- branches (5, 8): when no unfinished branch is left, the global
-- transaction gets its final status and moves to history.  A retryable
-- failure (6, 9) moves it to *Retrying with exponential backoff; an
-- unretryable one (7, 10: e.g. a dirty write) to *Failed, locks kept, for an
-- operator.  While Begin, a report is only recorded.
-- p_branch[i] = 0 records p_status[i] for every branch of p_xid[i] (all
-- branches acknowledged the commit: one item instead of one per branch).
CREATE FUNCTION tc_phase2_batch(p_xid text[], p_branch bigint[], p_status smallint[],
                                p_error text[], p_retry_min_ms int, p_retry_max_ms int)
RETURNS TABLE (item int, result text, global_status smallint, finished boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_present text[];  -- xids found (not yet finished) when the batch began
  v_missing int[];   -- items naming a branch that does not exist
  v_x text[];        -- per xid in phase two: family and outcome of this batch
  v_fam text[];
  v_unr boolean[];
  v_ret boolean[];
  v_err text[];
  v_final text[];    -- xids finished by this batch, and their final status
  v_final_status smallint[];
BEGIN
  -- Fast path, the common case of a healthy commit: every item says "all
  -- branches of this commit-family transaction committed".  Finish them
  -- without touching the branch rows one by one.
  IF p_branch <@ ARRAY[0::bigint] AND p_status <@ ARRAY[5::smallint] THEN
    SELECT coalesce(array_agg(l.xid), '{}') INTO v_final
      FROM (SELECT gt.xid, gt.status FROM global_table gt
             WHERE gt.xid = ANY (p_xid) ORDER BY gt.xid FOR UPDATE) l
     WHERE l.status IN (2, 3, 8);
    IF cardinality(v_final) = (SELECT count(DISTINCT x) FROM unnest(p_xid) AS x) THEN
      PERFORM tc__finish_many(v_final, array_fill(9::smallint, ARRAY[cardinality(v_final)]),
                              5::smallint);
      RETURN QUERY SELECT u.i::int, 'ok'::text, 9::smallint, true
                     FROM unnest(p_xid) WITH ORDINALITY AS u(x, i) ORDER BY u.i;
      RETURN;
    END IF;
  END IF;

  PERFORM 1 FROM global_table gt WHERE gt.xid = ANY (p_xid) ORDER BY gt.xid FOR UPDATE;
  SELECT coalesce(array_agg(gt.xid), '{}') INTO v_present
    FROM global_table gt WHERE gt.xid = ANY (p_xid);

  SELECT coalesce(array_agg(u.i::int), '{}') INTO v_missing
    FROM unnest(p_xid, p_branch) WITH ORDINALITY AS u(x, b, i)
   WHERE u.x = ANY (v_present) AND u.b <> 0
     AND NOT EXISTS (SELECT 1 FROM branch_table b WHERE b.branch_id = u.b AND b.xid = u.x);

  -- A phase-one report (2, 3) is recorded only while the branch is still in
  -- phase one: a late or repeated one never overwrites a phase-two outcome.
  UPDATE branch_table b
     SET status = u.s, last_error = u.e, gmt_modified = clock_timestamp()
    FROM unnest(p_xid, p_branch, p_status, p_error) AS u(x, br, s, e)
   WHERE b.xid = u.x AND (b.branch_id = u.br OR u.br = 0)
     AND (u.s NOT IN (2, 3) OR b.status IN (1, 2, 3));

  SELECT coalesce(array_agg(s.x), '{}'), coalesce(array_agg(s.fam), '{}'),
         coalesce(array_agg(s.unr), '{}'), coalesce(array_agg(s.ret), '{}'),
         coalesce(array_agg(s.err), '{}')
    INTO v_x, v_fam, v_unr, v_ret, v_err
    FROM (SELECT u.x,
                 CASE WHEN g.status IN (2, 3, 8, 10) THEN 'commit'
                      WHEN g.status IN (4, 5, 13) THEN 'rollback'
                      WHEN g.status IN (6, 7, 14) THEN 'timeout' END AS fam,
                 bool_or(u.s IN (7, 10)) AS unr, bool_or(u.s IN (6, 9)) AS ret,
                 (array_agg(u.e ORDER BY (u.s IN (7, 10)) DESC, (u.s IN (6, 9)) DESC)
                    FILTER (WHERE u.e IS NOT NULL))[1] AS err
            FROM unnest(p_xid, p_status, p_error) WITH ORDINALITY AS u(x, s, e, i)
            JOIN global_table g ON g.xid = u.x
           WHERE NOT (u.i = ANY (v_missing))
           GROUP BY u.x, g.status) s
   WHERE s.fam IS NOT NULL;

  -- Failures: unretryable -> *Failed (locks kept, for an operator);
  -- retryable -> *Retrying with exponential backoff.
  UPDATE global_table g
     SET status = CASE WHEN p.unr THEN
                    CASE p.fam WHEN 'commit' THEN 10 WHEN 'rollback' THEN 13 ELSE 14 END
                  ELSE CASE p.fam WHEN 'commit' THEN 3 WHEN 'rollback' THEN 5 ELSE 7 END END,
         last_error = p.err,
         retry_count = g.retry_count + CASE WHEN p.unr THEN 0 ELSE 1 END,
         next_retry_at = CASE WHEN p.unr THEN NULL ELSE
                           clock_timestamp() + least(p_retry_max_ms::double precision,
                             p_retry_min_ms * power(2::double precision, least(g.retry_count, 20)))
                             * interval '1 millisecond' END,
         gmt_modified = clock_timestamp()
    FROM unnest(v_x, v_fam, v_unr, v_ret, v_err) AS p(x, fam, unr, ret, err)
   WHERE g.xid = p.x AND (p.unr OR p.ret);

  -- Done: no unfinished branch left -> final status, history, rows gone.
  SELECT coalesce(array_agg(p.x), '{}'),
         coalesce(array_agg(CASE p.fam WHEN 'commit' THEN 9 WHEN 'rollback' THEN 11
                                       ELSE 12 END::smallint), '{}')
    INTO v_final, v_final_status
    FROM unnest(v_x, v_fam, v_unr, v_ret) AS p(x, fam, unr, ret)
   WHERE NOT p.unr AND NOT p.ret
     AND NOT EXISTS (SELECT 1 FROM branch_table b WHERE b.xid = p.x AND b.status NOT IN (5, 8));
  IF cardinality(v_final) > 0 THEN
    PERFORM tc__finish_many(v_final, v_final_status);
  END IF;

  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN NOT (u.x = ANY (v_present)) THEN 'not_found'
              WHEN u.i = ANY (v_missing) THEN 'branch_not_found'
              WHEN u.x = ANY (v_final) THEN 'ok'
              WHEN coalesce(v_unr[array_position(v_x, u.x)], false) THEN 'failed'
              WHEN coalesce(v_ret[array_position(v_x, u.x)], false) THEN 'retry'
              ELSE 'ok' END,
         CASE WHEN u.x = ANY (v_final) THEN v_final_status[array_position(v_final, u.x)]
              ELSE coalesce(g.status, 0::smallint) END,
         u.x = ANY (v_final)
    FROM unnest(p_xid) WITH ORDINALITY AS u(x, i)
    LEFT JOIN global_table g ON g.xid = u.x
   ORDER BY u.i;
END $$;

-- The leader's retry job claims due sessions (phase two unfinished, lease
-- expired) without blocking other nodes (SKIP LOCKED) and extends the lease
-- so that no other node drives them meanwhile.
CREATE FUNCTION tc_claim_retries(p_limit int, p_lease_ms int)
RETURNS TABLE (xid text, status smallint)
LANGUAGE sql AS $$
  UPDATE global_table g
     SET next_retry_at = clock_timestamp() + p_lease_ms * interval '1 millisecond'
    FROM (SELECT c.xid FROM global_table c
           WHERE c.status IN (2, 3, 4, 5, 6, 7, 8)
             AND c.next_retry_at <= clock_timestamp()
           ORDER BY c.next_retry_at
           LIMIT p_limit
           FOR UPDATE SKIP LOCKED) due
   WHERE g.xid = due.xid
  RETURNING g.xid, g.status
$$;
