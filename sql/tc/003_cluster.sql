-- sql/tc/003_cluster.sql - cluster membership of tcd nodes, version 3.
--
-- Applied by scripts/db-migrate to the TC database (set "tc") after 001 and
-- 002; never edit this file after it has shipped: add 004_*.sql instead.
--
-- Membership (cluster/tc_cluster.c):
--   * A node owns its node id by holding the session-level advisory lock
--     (tc_node_lock_class(), node_id) on a dedicated connection.  A second
--     process with the same id cannot take it and refuses to start; when a
--     node dies its session ends and the id frees itself at once.  No TTL.
--   * While it holds the lock the node keeps its node_table row current
--     (address, bus address, pid) and writes heartbeat_at every
--     cluster.heartbeat_ms.
--   * Operators read the nodes with the view tc_nodes (or
--     tc_cluster_nodes(stale_ms, leader_key) with other settings).
-- Leadership stays an advisory lock held by the leader's own connection
-- (tc_recovery.c, recovery.leader_lock_key).  tc_leader_try() adds the
-- lease: a holder whose node has not written a heartbeat for the lease is
-- stalled (e.g. SIGSTOPped), and a healthy node terminates its session,
-- which frees the lock.  Nothing here decides a transaction: every state
-- change stays a compare-and-set in 002's functions, so a stalled leader
-- that wakes up can only repeat what is already recorded.
--
-- Privileges: tc_leader_try() calls pg_terminate_backend(), which needs
-- superuser or membership in pg_signal_backend (GRANT pg_signal_backend TO
-- the tcd role).  Without it a stalled leader keeps the leadership until it
-- resumes or dies; tc_leader_try() then answers 'no-privilege'.

ALTER TABLE node_table
  ADD COLUMN bus_address text,
  ADD COLUMN backend_pid integer;

COMMENT ON COLUMN node_table.bus_address IS
  'nanomsg address of the node''s peer bus (cluster.bus), e.g. '
  'tcp://10.0.0.5:7101; NULL when the node runs without a bus. Peers read it '
  'to connect to each other.';
COMMENT ON COLUMN node_table.backend_pid IS
  'PostgreSQL backend pid of the node''s membership session, the one that '
  'holds its node-id advisory lock (pg_stat_activity.application_name '
  '''tcd-member/<node_id>'').';

-- The first key of every node-id advisory lock: pg_try_advisory_lock(
-- tc_node_lock_class(), node_id).  The two-int4 key form lives in another
-- key space than recovery.leader_lock_key (a bigint key), so they never
-- collide.
CREATE FUNCTION tc_node_lock_class() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 742074 $$;

COMMENT ON FUNCTION tc_node_lock_class() IS
  'First key of the per-node advisory locks (second key: node_id).';

-- Node ids whose advisory lock some session of this database holds now,
-- with that session's backend pid.
CREATE FUNCTION tc_live_node_ids() RETURNS TABLE (node_id integer, backend_pid integer)
LANGUAGE sql STABLE AS $$
  SELECT l.objid::bigint::integer, l.pid
    FROM pg_locks l
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
     AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
     AND l.classid = tc_node_lock_class()::oid
$$;

-- Claim node id p_node for this session.  claimed is true when this
-- session holds the lock (now or already); otherwise the other columns say
-- who has it, for the error message.
CREATE FUNCTION tc_node_claim(p_node integer)
RETURNS TABLE (claimed boolean, holder_backend_pid integer, holder_address text,
               holder_pid integer, holder_heartbeat_age_ms bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  IF pg_try_advisory_lock(tc_node_lock_class(), p_node) THEN
    RETURN QUERY SELECT true, NULL::integer, NULL::text, NULL::integer, NULL::bigint;
    RETURN;
  END IF;
  RETURN QUERY
  SELECT false, l.backend_pid, n.address, n.pid,
         (extract(epoch FROM clock_timestamp() - n.heartbeat_at) * 1000)::bigint
    FROM (SELECT 1) one
    LEFT JOIN tc_live_node_ids() l ON l.node_id = p_node
    LEFT JOIN node_table n ON n.node_id = p_node;
END $$;

-- Write this node's row.  Refused unless this session holds the node's
-- lock (tc_node_claim first), so two processes can never both write it.
CREATE FUNCTION tc_node_register(p_node integer, p_address text, p_admin_socket text,
                                 p_bus_address text, p_pid integer, p_version text)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  IF NOT EXISTS (SELECT 1 FROM tc_live_node_ids() l
                  WHERE l.node_id = p_node AND l.backend_pid = pg_backend_pid()) THEN
    RAISE EXCEPTION 'node id % is not claimed by this session', p_node
      USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'call tc_node_claim() first';
  END IF;
  INSERT INTO node_table AS n (node_id, address, admin_socket, bus_address, pid, version,
                               backend_pid, started_at, heartbeat_at, is_leader)
  VALUES (p_node, p_address, nullif(p_admin_socket, ''), nullif(p_bus_address, ''), p_pid,
          p_version, pg_backend_pid(), clock_timestamp(), clock_timestamp(), false)
  ON CONFLICT (node_id) DO UPDATE
    SET address = EXCLUDED.address,
        admin_socket = EXCLUDED.admin_socket,
        bus_address = EXCLUDED.bus_address,
        version = EXCLUDED.version,
        backend_pid = EXCLUDED.backend_pid,
        heartbeat_at = EXCLUDED.heartbeat_at,
        -- The same process coming back after a lost connection keeps its
        -- start time; another process is a new start.
        started_at = CASE WHEN n.pid IS DISTINCT FROM EXCLUDED.pid THEN EXCLUDED.started_at
                          ELSE n.started_at END,
        is_leader = CASE WHEN n.pid IS DISTINCT FROM EXCLUDED.pid THEN false ELSE n.is_leader END,
        pid = EXCLUDED.pid;
END $$;

-- Heartbeat of node p_node; fails (55000) when this session does not hold
-- the node's lock any more (the caller claims again).  Returns the other
-- nodes that hold their lock and have a bus address, for the peer bus.
CREATE FUNCTION tc_node_heartbeat(p_node integer, p_is_leader boolean)
RETURNS TABLE (node_id integer, bus_address text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
  UPDATE node_table n
     SET heartbeat_at = clock_timestamp(), is_leader = p_is_leader
   WHERE n.node_id = p_node AND n.backend_pid = pg_backend_pid()
     AND EXISTS (SELECT 1 FROM tc_live_node_ids() l
                  WHERE l.node_id = p_node AND l.backend_pid = pg_backend_pid());
  IF NOT FOUND THEN
    RAISE EXCEPTION 'node id % is not claimed by this session', p_node
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  RETURN QUERY
  SELECT n.node_id, n.bus_address
    FROM node_table n JOIN tc_live_node_ids() l ON l.node_id = n.node_id
   WHERE n.node_id <> p_node AND coalesce(n.bus_address, '') <> ''
   ORDER BY n.node_id;
END $$;

-- The cluster as operators see it, one row per node ever registered:
--   state  'up'            holds its node lock, heartbeat within p_stale_ms
--          'stalled'       holds its lock, heartbeat older (paused, or its
--                          loop is stuck); its leadership is fenced
--          'reconnecting'  lock not held but a recent heartbeat (e.g. the
--                          database just restarted)
--          'down'          neither: the process is gone
--   alive  = state <> 'down'
--   is_leader  the node whose leader connection holds p_leader_key now
--              (the truth, unlike node_table.is_leader which is what the
--              node reported at its last heartbeat)
CREATE FUNCTION tc_cluster_nodes(p_stale_ms integer DEFAULT 5000,
                                 p_leader_key bigint DEFAULT 7420742001)
RETURNS TABLE (node_id integer, state text, alive boolean, is_leader boolean, address text,
               bus_address text, admin_socket text, pid integer, version text,
               started_at timestamptz, heartbeat_at timestamptz, heartbeat_age_ms bigint,
               backend_pid integer)
LANGUAGE sql STABLE AS $$
  WITH live AS (SELECT * FROM tc_live_node_ids()),
  leader AS (
    SELECT substring(a.application_name FROM '^tcd-leader/([0-9]+)$')::integer AS node_id
      FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
       AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
       AND l.classid = (p_leader_key >> 32)::oid
       AND l.objid = (p_leader_key & 4294967295)::oid),
  n AS (
    SELECT n.*, (extract(epoch FROM clock_timestamp() - n.heartbeat_at) * 1000)::bigint AS age,
           lv.backend_pid AS live_pid
      FROM node_table n LEFT JOIN live lv ON lv.node_id = n.node_id)
  SELECT n.node_id,
         CASE WHEN n.live_pid IS NOT NULL AND n.age <= p_stale_ms THEN 'up'
              WHEN n.live_pid IS NOT NULL THEN 'stalled'
              WHEN n.age <= p_stale_ms THEN 'reconnecting'
              ELSE 'down' END,
         n.live_pid IS NOT NULL OR n.age <= p_stale_ms,
         EXISTS (SELECT 1 FROM leader WHERE leader.node_id = n.node_id),
         n.address, n.bus_address, n.admin_socket, n.pid, n.version, n.started_at,
         n.heartbeat_at, n.age, n.live_pid
    FROM n
   ORDER BY n.node_id
$$;

COMMENT ON FUNCTION tc_cluster_nodes(integer, bigint) IS
  'The tcd nodes and their state (up, stalled, reconnecting, down) and the '
  'current leader; arguments: staleness limit of heartbeats in ms (use '
  'cluster.leader_lease_ms) and recovery.leader_lock_key.';

CREATE VIEW tc_nodes AS SELECT * FROM tc_cluster_nodes();

COMMENT ON VIEW tc_nodes IS
  'tc_cluster_nodes() with the default settings: SELECT * FROM tc_nodes.';

-- One leadership attempt of node p_node for lock p_key:
--   'leader'        this session holds the lock (taken now, or already);
--   'held'          a healthy node holds it;
--   'fenced'        the holder's node has not written a heartbeat for
--                   p_lease_ms (stalled): its session was terminated, so the
--                   lock is free for the next attempt (of any node);
--   'no-privilege'  the holder is stalled but this role may not terminate it.
-- Only a node whose own heartbeat is fresh (within half the lease) fences,
-- so a node that has just woken from a pause never fences a healthy leader.
CREATE FUNCTION tc_leader_try(p_key bigint, p_node integer, p_lease_ms integer)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  v_pid integer;
  v_app text;
  v_holder integer;
BEGIN
  IF pg_try_advisory_lock(p_key) THEN
    RETURN 'leader';
  END IF;
  SELECT l.pid, a.application_name INTO v_pid, v_app
    FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
     AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
     AND l.classid = (p_key >> 32)::oid AND l.objid = (p_key & 4294967295)::oid
   LIMIT 1;
  v_holder := substring(v_app FROM '^tcd-leader/([0-9]+)$')::integer;
  IF v_pid IS NULL OR v_holder IS NULL OR v_holder = p_node THEN
    RETURN 'held';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM node_table n
                  WHERE n.node_id = v_holder
                    AND n.heartbeat_at < clock_timestamp() - p_lease_ms * interval '1 millisecond') THEN
    RETURN 'held';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM node_table n
                  WHERE n.node_id = p_node AND n.backend_pid IS NOT NULL
                    AND n.heartbeat_at >= clock_timestamp() - (p_lease_ms / 2) * interval '1 millisecond') THEN
    RETURN 'held';
  END IF;
  BEGIN
    PERFORM pg_terminate_backend(v_pid);
  EXCEPTION WHEN insufficient_privilege THEN
    RETURN 'no-privilege';
  END;
  RETURN 'fenced';
END $$;

-- The leader's adoption job: sessions whose first phase-two drive belongs
-- to a node that is gone (its node lock is free) are made due at once, so
-- the retry job drives them now instead of when the deciding node's lease
-- (tc_decide_batch's p_lease_ms) runs out.  Only the first drive (statuses
-- Committing, Rollbacking, TimeoutRollbacking, AsyncCommitting); *Retrying
-- sessions keep their backoff.  global_table.node_id is the node that began
-- the transaction, which is also the node clients send its commit to; when
-- another node decided it, that node's lease is cut short and the branch
-- may be driven twice, which branches absorb (phase two is idempotent).
-- Rows locked by a running batch are skipped (no waiting, no deadlock).
-- Returns how many sessions were made due.
CREATE FUNCTION tc_adopt_orphans() RETURNS integer
LANGUAGE sql AS $$
  WITH live AS (SELECT node_id FROM tc_live_node_ids()),
  due AS (
    SELECT g.xid FROM global_table g
     WHERE g.status IN (2, 4, 6, 8) AND g.next_retry_at > clock_timestamp()
       AND NOT EXISTS (SELECT 1 FROM live WHERE live.node_id = g.node_id)
     FOR UPDATE SKIP LOCKED),
  upd AS (
    UPDATE global_table g SET next_retry_at = clock_timestamp()
      FROM due WHERE g.xid = due.xid
    RETURNING 1)
  SELECT count(*)::integer FROM upd
$$;
