#!/usr/bin/python3
"""faultcheck.py - the fault suite's invariant checker: reads PostgreSQL and
Redis directly (through flashsale --check-only and its own queries).

Usage: tests/faults/faultcheck.py --activity ID [--since TS] [--wait S]
                                  [--bin DIR] [--no-reconcile]
Environment: TC_PG_URL, ORDERS_PG_URL, STOCK_PG_URL, REDIS_URL, ORDER_URL,
TC_ADMIN_SOCKETS (as cluster/local/up --with-services prints them).

  1. waits (up to --wait s) until the coordinator settled: no unfinished
     global transaction, no pending undo row of a finished xid (lost
     phase-two deletes of a killed RM included: the restarted RM resolves
     them through the coordinator, at start-up or after its grace period);
  2. its own invariants (those flashsale --check-only lacks):
       globals_terminal   every global Committed or RolledBack, or in a
                          manual-handling state listed by `tcctl globals`
       no_orphan_locks    no lock_table row of a finished or missing xid
       no_orphan_prepared no prepared transaction of an XA branch ("txc:%")
                          left once the coordinator settled
       no_finished_undo   no log_status=0 undo_log row (orders, stock) of a
                          finished or missing xid
       commits_durable    every committed global of the run is present in
                          both branch databases (order: trade_order and the
                          stock_log freeze row; pay/cancel/expire: the
                          stock_log confirm/release row), every rolled-back
                          one in neither (atomicity)
       local_orders_settled  every order taken in fallback-to-local mode
                          (order_compensation) was finished by the service
                          or the compensation job, the same way in both
                          databases: FROZEN with the stock database's FROZEN
                          decision, CANCELLED with its REFUSED decision and
                          the order CANCELLED with a reason
  3. flashsale --check-only before reconciliation (Redis drift is reported,
     not failed: an unknown outcome keeps its Redis freeze by design), then
     fault_reconcile (Redis <- PostgreSQL), then --check-only again: every
     invariant there must hold (no oversell in PG and Redis, totals
     conserved, globals finished, no leftover locks, Redis equals PG).
Prints one line per invariant and a JSON summary line "RESULT {...}";
exit 0 all hold, 1 a violation.
"""
import argparse, json, os, subprocess, sys, time

import psycopg2

TERMINAL = (9, 11, 12, 15)          # Committed, Rollbacked, TimeoutRollbacked, Finished
OPERATOR = (10, 13, 14, 19, 20)     # CommitFailed, *RollbackFailed, Stop*Retry
ROLLED = (11, 12)


def conn(url):
    c = psycopg2.connect(url, connect_timeout=5)
    c.autocommit = True
    return c


def q(c, sql, args=()):
    with c.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall()


class Checker:
    def __init__(self, env, bin_dir, since=None):
        self.env = env
        self.bin = bin_dir
        self.tc = conn(env['TC_PG_URL'])
        self.orders = conn(env['ORDERS_PG_URL'])
        self.stock = conn(env['STOCK_PG_URL'])
        self.since = since or '-infinity'

    def close(self):
        for c in (self.tc, self.orders, self.stock):
            try:
                c.close()
            except Exception:
                pass

    def unfinished(self, before=None):
        sql = "SELECT count(*) FROM global_table WHERE status <> ALL(%s)"
        args = [list(OPERATOR)]
        if before:
            sql += " AND begin_time <= %s"
            args.append(before)
        return q(self.tc, sql, args)[0][0]

    def live_xids(self):
        return {r[0]: r[1] for r in q(self.tc, "SELECT xid, status FROM global_table")}

    def finished_undo(self):
        """Pending (log_status 0) undo rows of finished or missing xids, as
        (bad, committed): 'committed' are those of xids committed with every
        branch PhaseTwo_Committed, i.e. lost phase-two deletes (an RM killed
        between acknowledging the commit and flushing its delete queue).
        Both violate "no undo row of a finished xid"; librmclient resolves
        the lost deletes through the coordinator (rm_undo.c: at start-up,
        then every resolve_interval_s for rows older than resolve_grace_s),
        so the settle phase waits for them."""
        live = self.live_xids()
        cand = []
        for name, c in (('orders', self.orders), ('stock', self.stock)):
            for (xid,) in q(c, "SELECT xid FROM undo_log WHERE log_status = 0"):
                st = live.get(xid)
                if st is None or st in TERMINAL:
                    cand.append((name, xid))
        committed = set()
        if cand:
            committed = {r[0] for r in q(self.tc, """SELECT xid FROM global_history WHERE xid = ANY(%s)
                AND status = 9 AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(tc_history_branches(branches)) b
                                               WHERE (b->>'status')::int <> 5)""", ([x for _, x in cand],))}
        bad = ['%s:%s' % (n, x) for n, x in cand]
        return bad, [b for (n, x), b in zip(cand, bad) if x in committed]

    def pending_local(self):
        return q(self.orders, "SELECT count(*) FROM order_compensation WHERE state = 'PENDING'")[0][0]

    def settled(self):
        return self.unfinished() == 0 and not self.finished_undo()[0] and self.pending_local() == 0

    def wait_settled(self, wait_s):
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait_s:
            try:
                if self.settled():
                    return time.monotonic() - t0
            except psycopg2.Error:
                pass
            time.sleep(0.25)
        return None

    def run_invariants(self):
        inv = {}
        # globals_terminal
        rows = q(self.tc, "SELECT xid, status, coalesce(last_error, '') FROM global_table")
        unfinished = [r for r in rows if r[1] not in OPERATOR]
        operator = [r for r in rows if r[1] in OPERATOR]
        listed = set()
        if operator:
            sock = self.env.get('TC_ADMIN_SOCKETS', '').split(',')[0]
            try:
                out = subprocess.run([os.path.join(self.bin, 'tcctl'), '--socket', sock, '--json', 'globals',
                                      '--limit', '10000'], capture_output=True, text=True, timeout=30).stdout
                listed = {x for x in (r[0] for r in operator) if x in out}
            except Exception:
                pass
        not_listed = [r[0] for r in operator if r[0] not in listed]
        inv['globals_terminal'] = (not unfinished and not not_listed,
                                   '%d unfinished%s; %d for an operator (%d not listed by tcctl)%s' % (
                                       len(unfinished), (' e.g. %s status %d' % unfinished[0][:2]) if unfinished else '',
                                       len(operator), len(not_listed),
                                       (': ' + '; '.join('%s %d %s' % r for r in operator[:3])) if operator else ''))
        # no_orphan_locks
        orphans = q(self.tc, """SELECT l.xid, g.status FROM lock_table l LEFT JOIN global_table g USING (xid)
                                 WHERE g.xid IS NULL OR g.status = ANY(%s)""", (list(TERMINAL),))
        inv['no_orphan_locks'] = (not orphans, '%d lock rows of finished or missing xids%s' % (
            len(orphans), (' e.g. %s' % orphans[0][0]) if orphans else ''))
        # no_orphan_prepared: an XA branch (STOCK_FREEZE_MODE=xa) is a
        # prepared transaction "txc:BRANCH:XID" until its phase two; once
        # the coordinator settled, none may be left holding its row locks
        prepared = q(self.stock, "SELECT gid, database FROM pg_prepared_xacts WHERE gid LIKE 'txc:%%'")
        inv['no_orphan_prepared'] = (not prepared, '%d prepared XA branches left%s' % (
            len(prepared), (' e.g. %s in %s' % prepared[0]) if prepared else ''))
        # no_finished_undo
        bad, committed = self.finished_undo()
        inv['no_finished_undo'] = (not bad, '%d pending undo rows of finished or missing xids%s%s' % (
            len(bad), (' e.g. ' + bad[0]) if bad else '',
            (' (%d of committed xids: lost phase-two deletes the RM did not resolve)' % len(committed))
            if committed else ''))
        # commits_durable (and atomicity of the rolled-back ones)
        hist = q(self.tc, """SELECT xid, status, coalesce(transaction_name, '') FROM global_history
                              WHERE begin_time >= %s::timestamptz""", (self.since,))
        ord_x = {r[0] for r in q(self.orders, "SELECT xid FROM trade_order WHERE xid IS NOT NULL")}
        log = {}
        for xid, op in q(self.stock, "SELECT xid, op FROM stock_log WHERE xid IS NOT NULL"):
            log.setdefault(xid, set()).add(op)
        want_op = {'order': 'freeze', 'pay': 'confirm', 'cancel': 'release', 'expire': 'release'}
        lost, leaked, ncommit, nroll = [], [], 0, 0
        for xid, st, name in hist:
            if name not in want_op:
                continue
            op = want_op[name]
            in_stock = op in log.get(xid, ())
            in_orders = xid in ord_x if name == 'order' else None
            if st == 9:
                ncommit += 1
                if not in_stock or in_orders is False:
                    lost.append('%s %s (orders %s, stock %s)' % (name, xid, in_orders, in_stock))
            elif st in ROLLED:
                nroll += 1
                if in_stock or in_orders:
                    leaked.append('%s %s (orders %s, stock %s)' % (name, xid, in_orders, in_stock))
        inv['commits_durable'] = (not lost and not leaked,
                                  '%d committed present in both databases, %d rolled back absent from both; '
                                  'missing %d%s; rolled back but present %d%s' % (
                                      ncommit - len(lost), nroll - len(leaked), len(lost),
                                      (' e.g. ' + lost[0]) if lost else '', len(leaked),
                                      (' e.g. ' + leaked[0]) if leaked else ''))
        # local_orders_settled (fallback-to-local mode)
        local = q(self.orders, """SELECT c.order_id, c.state, coalesce(c.outcome, ''), o.status,
                                         coalesce(o.cancel_reason, '')
                                    FROM order_compensation c JOIN trade_order o USING (order_id)""")
        decided = dict(q(self.stock, "SELECT order_id, state FROM stock_compensation"))
        wrong = []
        for oid, state, outcome, ostatus, reason in local:
            stock = decided.get(oid)
            if state != 'DONE':
                wrong.append('%d still %s' % (oid, state))
            elif outcome == 'FROZEN' and stock != 'FROZEN':
                wrong.append('%d FROZEN, stock database says %s' % (oid, stock))
            elif outcome == 'CANCELLED' and (stock != 'REFUSED' or ostatus != 'CANCELLED' or not reason):
                wrong.append('%d CANCELLED, stock database says %s, order %s reason %r' % (oid, stock, ostatus, reason))
        self.local_orders = len(local)
        inv['local_orders_settled'] = (not wrong, '%d orders taken in local mode, %d cancelled by compensation; '
                                       '%d inconsistent%s' % (
                                           len(local), sum(1 for r in local if r[2] == 'CANCELLED'), len(wrong),
                                           (' e.g. ' + wrong[0]) if wrong else ''))
        self.transactions = len(hist) + len(rows)
        self.timeout_rollbacks = sum(1 for r in hist if r[1] == 12)
        return inv

    def flashsale_check(self, activity):
        p = subprocess.run([os.path.join(self.bin, 'flashsale'), '--check-only', '--activity', str(activity),
                            '--settle', '5', '--quiet'], capture_output=True, text=True, timeout=120,
                           env=self.env)
        res = {}
        for line in p.stdout.splitlines():
            parts = line.split(None, 2)
            if len(parts) >= 2 and parts[1] in ('ok', 'FAILED', 'skipped') and line.startswith('  '):
                res[parts[0]] = (parts[1] != 'FAILED', parts[2] if len(parts) > 2 else '')
        if not res:
            res['flashsale_check'] = (False, 'flashsale --check-only gave no result (status %d): %s' % (
                p.returncode, (p.stderr or p.stdout)[-300:]))
        return res

    def reconcile(self, activity):
        p = subprocess.run([os.path.join(self.bin, 'fault_reconcile'), str(activity)], capture_output=True,
                           text=True, timeout=120, env=self.env)
        return p.returncode == 0, (p.stdout + p.stderr).strip()


def full_check(env, bin_dir, activity, since=None, wait_s=60, reconcile=True, log=print):
    """Returns (violations: list of str, info: dict)."""
    ck = Checker(env, bin_dir, since)
    t0 = time.monotonic()
    try:
        settle = ck.wait_settled(wait_s)
        info = {'settled_s': settle}
        log('  (settled in %s)' % ('%.1f s' % settle if settle is not None else 'NOT within %g s' % wait_s))
        inv = ck.run_invariants()
        pre = ck.flashsale_check(activity)
        drift = [k for k in ('redis_equals_pg', 'no_oversell_redis') if k in pre and not pre[k][0]]
        info['redis_drift_before_reconcile'] = drift
        for k in ('no_oversell_pg', 'totals_conserved'):
            if k in pre:  # PostgreSQL figures must hold before any repair
                inv[k + '(pre)'] = pre[k]
        if reconcile:
            ok, msg = ck.reconcile(activity)
            inv['reconcile'] = (ok, msg)
        post = ck.flashsale_check(activity)
        for k, v in post.items():
            if k == 'client_view':
                continue  # no client in --check-only; the sale's own report has it
            inv[k] = v
        info['transactions'] = ck.transactions
        info['timeout_rollbacks'] = ck.timeout_rollbacks
        info['local_orders'] = ck.local_orders
        violations = []
        for k, (ok, detail) in inv.items():
            log('  %-26s %-6s %s' % (k, 'ok' if ok else 'FAILED', detail))
            if not ok:
                violations.append('%s: %s' % (k, detail))
        if drift:
            log('  (Redis differed from PostgreSQL before reconciliation: %s)' % ', '.join(drift))
        log('  (settle and checks took %.1f s)' % (time.monotonic() - t0))
        return violations, info
    finally:
        ck.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--activity', type=int, required=True)
    ap.add_argument('--since')
    ap.add_argument('--wait', type=float, default=60)
    ap.add_argument('--bin', default=os.environ.get('TX_BIN_DIR') or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), '..', '..', 'build', 'bin'))
    ap.add_argument('--no-reconcile', action='store_true')
    a = ap.parse_args()
    v, info = full_check(dict(os.environ), a.bin, a.activity, a.since, a.wait, not a.no_reconcile)
    print('RESULT ' + json.dumps({'violations': v, **info}))
    sys.exit(1 if v else 0)


if __name__ == '__main__':
    main()
