-- sql/tc/008_ownership.sql - who may act on a global transaction
-- (coordinator database, version 8).
--
-- Applications authenticate with their own secret and belong to a group
-- (tc/tc_creds.h; README "Security model").  The store now records, for
-- each global transaction, the group of the application that began it
-- (app_group) and, for each branch, the application that registered it;
-- the batch functions take the caller's application and group with every
-- item and refuse ('not_owner') what it may not do:
--
--   * BranchRegister: an application of the global's group only;
--   * GlobalCommit / GlobalRollback / GlobalReport: the application that
--     began the global, or one of its group that registered a branch in it
--     (tc__may_decide); once the global has finished, its group;
--   * BranchReport: the RM (application and client id) that registered the
--     branch;
--   * GlobalBegin's idempotency key is the application's: two applications
--     using one key get two transactions.
--
-- A NULL group means "the coordinator itself" (the timeout job, phase-two
-- outcomes, operators' repairs): not checked.  The checks are conditions of
-- the statements the batches run anyway, so the hot path gains no round
-- trip and no statement.
--
-- Rows written before this version were all begun by holders of the one
-- shared token: they get its group (tc_creds.h TC_CREDS_TOKEN_GROUP).
--
-- Never edit this file after it has shipped: add sql/tc/009_*.sql instead.

ALTER TABLE global_table ADD COLUMN app_group text;
ALTER TABLE global_history ADD COLUMN app_group text;
ALTER TABLE branch_table ADD COLUMN application_id text;
ALTER TABLE branch_table ADD COLUMN app_group text;
UPDATE global_table SET app_group = '*token*' WHERE app_group IS NULL;
UPDATE global_history SET app_group = '*token*' WHERE app_group IS NULL;

COMMENT ON COLUMN global_table.application_id IS
  'Application that began the transaction (authenticated at registration when the TC has a '
  'credentials file): it may commit, roll back and report on it.';
COMMENT ON COLUMN global_table.app_group IS
  'Group of the beginning application (tc_creds.h): only applications of this group may register '
  'branches; ''*token*'' for holders of the legacy shared server.token.';
COMMENT ON COLUMN global_history.app_group IS 'As in global_table.';
COMMENT ON COLUMN branch_table.application_id IS
  'Application of the RM that registered the branch: only that RM (this application and client_id) '
  'may report it, and its application may commit or roll back the global. NULL before version 8.';
COMMENT ON COLUMN branch_table.app_group IS
  'Group of that application: phase two goes to an RM of this group only (tc_server_find_branch_rm). '
  'NULL before version 8.';

-- GlobalBegin's idempotency keys are per application.
CREATE UNIQUE INDEX global_table_app_idem_key_idx ON global_table (application_id, idem_key)
  WHERE idem_key IS NOT NULL;
DROP INDEX global_table_idem_key_idx;
COMMENT ON INDEX global_table_app_idem_key_idx IS
  'A retried GlobalBegin with the same idempotency key of the same application finds the first xid '
  '(tc_begin_batch); begins without a key have no entry.';

DROP FUNCTION tc_begin_batch(text[], bigint[], int[], text[], text[], text[], int);
DROP FUNCTION tc_register_batch(text[], bigint[], text[], smallint[], text[], text[], text[], text[],
                                int[], text[], text[], text[]);
DROP FUNCTION tc_decide_batch(text[], text[], int);
DROP FUNCTION tc_phase2_batch(text[], bigint[], smallint[], text[], int, int);

-- Whether the caller (application 'p_app' of group 'p_group'; NULL group:
-- the coordinator itself) may commit or roll back the live global 'p_xid'
-- begun by 'g_app' of 'g_group'.  The branch lookup (an application that
-- registered a branch) runs only for a caller that did not begin it.
CREATE FUNCTION tc__may_decide(p_xid text, g_app text, g_group text, p_app text, p_group text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT p_group IS NULL
      OR (g_group = p_group
          AND (g_app = p_app
               OR EXISTS (SELECT 1 FROM branch_table b WHERE b.xid = p_xid AND b.application_id = p_app)))
$$;
COMMENT ON FUNCTION tc__may_decide(text, text, text, text, text) IS
  'Ownership rule of GlobalCommit/GlobalRollback (sql/tc/008_ownership.sql).';

CREATE OR REPLACE FUNCTION tc__finish_many(p_xid text[], p_status smallint[],
                                           p_branch_status smallint DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  -- One statement: every part sees the rows as they were before it, so
  -- history reads the branches that the same statement deletes.
  WITH hist AS (
    INSERT INTO global_history (xid, transaction_id, status, application_id, app_group,
                                transaction_name, begin_time, branches)
    SELECT g.xid, g.transaction_id, f.s, g.application_id, g.app_group, g.transaction_name,
           g.begin_time,
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

CREATE FUNCTION tc_begin_batch(p_xid text[], p_txid bigint[], p_timeout_ms int[], p_name text[],
                               p_app text[], p_group text[], p_idem text[], p_node int)
RETURNS TABLE (item int, xid text, result text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_inserted text[];
BEGIN
  WITH ins AS (
    INSERT INTO global_table (xid, transaction_id, status, application_id, app_group,
                              transaction_name, timeout_ms, deadline, node_id, idem_key)
    SELECT u.x, u.t, 1, u.a, u.g, u.n, u.ms, clock_timestamp() + u.ms * interval '1 millisecond',
           p_node, u.k
      FROM unnest(p_xid, p_txid, p_timeout_ms, p_name, p_app, p_group, p_idem)
           AS u(x, t, ms, n, a, g, k)
    ON CONFLICT (application_id, idem_key) WHERE idem_key IS NOT NULL DO NOTHING
    RETURNING global_table.xid)
  SELECT coalesce(array_agg(ins.xid), '{}') INTO v_inserted FROM ins;

  IF cardinality(v_inserted) = cardinality(p_xid) THEN
    RETURN QUERY SELECT u.i::int, u.x, 'ok'::text
                   FROM unnest(p_xid) WITH ORDINALITY AS u(x, i) ORDER BY u.i;
    RETURN;
  END IF;
  -- Items not inserted repeated an idempotency key of their application:
  -- answer the first xid.
  -- (A new statement: it sees the rows of a concurrent begin that the
  -- insert waited for.)
  RETURN QUERY
  SELECT u.i::int,
         CASE WHEN u.x = ANY (v_inserted) THEN u.x ELSE g.xid END,
         CASE WHEN u.x = ANY (v_inserted) OR g.xid IS NOT NULL THEN 'ok' ELSE 'finished' END
    FROM unnest(p_xid, p_app, p_idem) WITH ORDINALITY AS u(x, a, k, i)
    LEFT JOIN global_table g ON NOT (u.x = ANY (v_inserted)) AND g.idem_key = u.k
                            AND g.application_id = u.a
   ORDER BY u.i;
END $$;

CREATE FUNCTION tc_register_batch(p_xid text[], p_branch bigint[], p_resource text[],
                                  p_type smallint[], p_lock_keys text[], p_app_data text[],
                                  p_client text[], p_idem text[], p_app text[], p_group text[],
                                  l_item int[], l_row text[], l_table text[], l_pk text[])
RETURNS TABLE (item int, result text, branch_id bigint, holder text, holder_status smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_active int[];     -- items whose global is Begin, not past its deadline, of their group
  v_denied int[];     -- items whose global another group began
  v_dup int[];        -- items repeating an idempotency key: v_dup_branch[k] is theirs
  v_dup_branch bigint[];
  v_conflict int[];   -- items that met a key held by another xid
  v_holder text[];
  v_holder_status smallint[];
  v_wanted bigint;    -- lock rows of the items that may take keys
  v_taken bigint;     -- of those, the rows the insert took
BEGIN
  -- 1. Share-lock the globals (in xid order): a decision cannot slip in
  --    between this check and the inserts below.  Only an application of
  --    the group that began a global may register in it (p_group NULL: not
  --    checked).
  SELECT coalesce(array_agg(u.i::int) FILTER (WHERE (u.gr IS NULL OR g.app_group = u.gr)
                                                AND g.status = 1 AND g.deadline >= clock_timestamp()),
                  '{}'),
         coalesce(array_agg(u.i::int) FILTER (WHERE u.gr IS NOT NULL AND g.app_group IS DISTINCT FROM u.gr),
                  '{}')
    INTO v_active, v_denied
    FROM unnest(p_xid, p_group) WITH ORDINALITY AS u(x, gr, i)
    JOIN (SELECT gt.xid, gt.status, gt.deadline, gt.app_group FROM global_table gt
           WHERE gt.xid = ANY (p_xid) ORDER BY gt.xid FOR SHARE) g ON g.xid = u.x;

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
  --    queued first.  The insert counts what it took: when every wanted
  --    key is taken, nothing conflicts, and the usual batch is done with
  --    its locks in one statement.
  IF cardinality(l_item) > 0 THEN
  WITH want AS (
    SELECT l.it, l.r, l.t, l.p
      FROM unnest(l_item, l_row, l_table, l_pk) AS l(it, r, t, p)
     WHERE l.it = ANY (v_active) AND NOT (l.it = ANY (v_dup))),
  ins AS (
    INSERT INTO lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk)
    SELECT w.r, p_xid[w.it], gt.transaction_id, p_branch[w.it], p_resource[w.it], w.t, w.p
      FROM want w
      JOIN global_table gt ON gt.xid = p_xid[w.it]
     ORDER BY w.r, w.it
    ON CONFLICT (row_key) DO NOTHING
    RETURNING 1)
  SELECT (SELECT count(*) FROM want), (SELECT count(*) FROM ins) INTO v_wanted, v_taken;

  -- 4. Otherwise the conflicts, in a statement of its own (a snapshot taken
  --    after the insert, which waited for any concurrent batch that held
  --    one of the keys): a wanted key whose row belongs to another xid.  A
  --    key whose row this batch inserted for another item, or that nobody
  --    holds any more, shows as a conflict with an empty holder: tcd
  --    retries that item at once (the keys another item of this batch took
  --    may be given back in step 5).  A key the same xid holds (another of
  --    its branches) is not a conflict.
  IF v_taken < v_wanted THEN
  SELECT coalesce(array_agg(c.it), '{}'), coalesce(array_agg(c.hx), '{}'),
         coalesce(array_agg(c.hs), '{}')
    INTO v_conflict, v_holder, v_holder_status
    FROM (SELECT DISTINCT ON (l.it) l.it, lt.xid AS hx, lt.status AS hs
            FROM unnest(l_item, l_row) AS l(it, r)
            LEFT JOIN lock_table lt ON lt.row_key = l.r AND NOT (lt.branch_id = ANY (p_branch))
           WHERE l.it = ANY (v_active) AND NOT (l.it = ANY (v_dup))
             AND NOT EXISTS (SELECT 1 FROM lock_table mine
                              WHERE mine.row_key = l.r AND mine.branch_id = p_branch[l.it])
             AND (lt.xid IS NULL OR lt.xid <> p_xid[l.it])
           ORDER BY l.it, lt.status DESC NULLS LAST) c;
  END IF;

  -- 5. A conflicting item gives back the keys it took.
  IF cardinality(v_conflict) > 0 THEN
    DELETE FROM lock_table lt
     USING unnest(v_conflict) AS c(i)
     WHERE lt.xid = p_xid[c.i] AND lt.branch_id = p_branch[c.i];
  END IF;
  END IF;

  -- 6. Branch rows of the items that got all their keys.
  INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, branch_type, status,
                            lock_keys, application_data, client_id, idem_key, application_id,
                            app_group)
  SELECT u.b, u.x, gt.transaction_id, u.r, u.ty, 1, u.lk, u.ad, u.cl, u.k, u.ap, u.gr
    FROM unnest(p_xid, p_branch, p_resource, p_type, p_lock_keys, p_app_data, p_client, p_idem,
                p_app, p_group)
         WITH ORDINALITY AS u(x, b, r, ty, lk, ad, cl, k, ap, gr, i)
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
              WHEN u.i = ANY (v_denied) THEN 'not_owner'
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
              WHEN NOT (u.i = ANY (v_active)) AND NOT (u.i = ANY (v_denied)) THEN gt.status END
    FROM unnest(p_xid, p_branch) WITH ORDINALITY AS u(x, b, i)
    LEFT JOIN global_table gt ON gt.xid = u.x
   ORDER BY u.i;
END $$;

CREATE FUNCTION tc_decide_batch(p_xid text[], p_action text[], p_app text[], p_group text[],
                                p_lease_ms int)
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
  -- Only items that may act on the xid take part (tc__may_decide): a
  -- stranger's rollback can neither decide nor stand in the owner's way.
  WITH firsts AS (
    SELECT DISTINCT ON (u.x) u.x, u.a, u.i::int AS i
      FROM unnest(p_xid, p_action, p_app, p_group) WITH ORDINALITY AS u(x, a, ap, gr, i)
      JOIN global_table g ON g.xid = u.x
     WHERE tc__may_decide(g.xid, g.application_id, g.app_group, u.ap, u.gr)
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
              WHEN g.xid IS NOT NULL AND NOT tc__may_decide(g.xid, g.application_id, g.app_group, u.ap, u.gr)
                THEN 'not_owner'
              WHEN g.xid IS NULL AND h.xid IS NOT NULL AND u.gr IS NOT NULL
                   AND h.app_group IS DISTINCT FROM u.gr THEN 'not_owner'
              WHEN g.status = 1 THEN 'not_expired'
              WHEN g.xid IS NOT NULL THEN 'decided'
              WHEN h.xid IS NOT NULL THEN 'finished'
              ELSE 'not_found' END,
         CASE WHEN u.i = ANY (v_items) THEN v_status[array_position(v_items, u.i::int)]
              WHEN g.xid IS NOT NULL AND NOT tc__may_decide(g.xid, g.application_id, g.app_group, u.ap, u.gr)
                THEN 0::smallint
              WHEN g.xid IS NULL AND h.xid IS NOT NULL AND u.gr IS NOT NULL
                   AND h.app_group IS DISTINCT FROM u.gr THEN 0::smallint
              ELSE coalesce(g.status, h.status, 0::smallint) END
    FROM unnest(p_xid, p_app, p_group) WITH ORDINALITY AS u(x, ap, gr, i)
    LEFT JOIN global_table g ON g.xid = u.x
    LEFT JOIN global_history h ON g.xid IS NULL AND h.xid = u.x
   ORDER BY u.i;
END $$;

CREATE FUNCTION tc_phase2_batch(p_xid text[], p_branch bigint[], p_status smallint[],
                                p_error text[], p_app text[], p_client text[], p_group text[],
                                p_retry_min_ms int, p_retry_max_ms int)
RETURNS TABLE (item int, result text, global_status smallint, finished boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
  v_present text[];  -- xids found (not yet finished) when the batch began
  v_missing int[];   -- items naming a branch that does not exist
  v_denied int[];    -- reports of a branch by another RM than the one that registered it
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

  -- A branch report (p_app given) is taken only from the RM that registered
  -- the branch: its application and client id.  (Branches registered before
  -- version 8 have no application: then its group suffices.)
  v_denied := '{}';
  IF cardinality(array_remove(p_app, NULL)) > 0 THEN
    SELECT coalesce(array_agg(u.i::int), '{}') INTO v_denied
      FROM unnest(p_xid, p_branch, p_app, p_client, p_group) WITH ORDINALITY AS u(x, b, ap, cl, gr, i)
      JOIN branch_table b ON b.branch_id = u.b AND b.xid = u.x
      JOIN global_table g ON g.xid = u.x
     WHERE u.ap IS NOT NULL
       AND NOT CASE WHEN b.application_id IS NULL THEN g.app_group IS NOT DISTINCT FROM u.gr
                    ELSE b.application_id = u.ap AND b.client_id IS NOT DISTINCT FROM u.cl END;
    v_missing := v_missing || v_denied;
  END IF;

  -- A phase-one report (2, 3) is recorded only while the branch is still in
  -- phase one: a late or repeated one never overwrites a phase-two outcome.
  UPDATE branch_table b
     SET status = u.s, last_error = u.e, gmt_modified = clock_timestamp()
    FROM unnest(p_xid, p_branch, p_status, p_error) WITH ORDINALITY AS u(x, br, s, e, i)
   WHERE b.xid = u.x AND (b.branch_id = u.br OR u.br = 0)
     AND (u.s NOT IN (2, 3) OR b.status IN (1, 2, 3))
     AND NOT (u.i = ANY (v_denied));

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
              WHEN u.i = ANY (v_denied) THEN 'not_owner'
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
