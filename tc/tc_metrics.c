/*
 * tc_metrics.c - Prometheus text format, /healthz and /readyz; see
 * tc_metrics.h.
 *
 * NOTES
 *   Loop side: a timer publishes the snapshot every TC_METRICS_PUBLISH_MS
 *   and, every TC_METRICS_PROBE_MS, starts one store probe (never two at
 *   once).  HTTP side (libmicrohttpd's internal polling thread): copy the
 *   snapshot under the mutex, then format without holding it.
 *
 *   Metric names follow the Prometheus conventions: txc_ prefix, _total
 *   for counters, base units (seconds), labels for the dimensions of one
 *   quantity (decision, status, role, kind).  Counters are this node's
 *   since it started; gauges from the probe (active sessions, retry
 *   queue) are cluster-wide, read from the store.
 */
#include "tc_metrics.h"

#include <inttypes.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "tc_admin.h"
#include "tc_lockwait.h"
#include "tc_log.h"
#include "tc_parts.h"
#include "tc_phase2.h"
#include "tc_stats.h"
#include "tc_store_read.h"
#include "tc_recovery.h"
#include "tc_server.h"
#include "txc_httpguard.h"
#include "txc_procstat.h"

#ifndef TC_SCHEMA_VERSIONS
#define TC_SCHEMA_VERSIONS "1,2"
#endif

/* What a handler may read: copied in and out under 'mu'. */
typedef struct snap {
  uint64_t published_ns; /* 0: never */
  tc_stats_t st;         /* the node's figures (tc_stats.h) */
  /* the last probe */
  bool probed;
  uint64_t probed_ns;
  bool db_ok;
  bool schema_ok;
  char probe_error[256];
  bool sessions_valid;
  int64_t sessions[TXP_GS__MAX];
  int64_t retry_depth, retry_due;
} snap_t;

struct tc_metrics {
  tc_ctx_t *ctx;
  struct MHD_Daemon *mhd;
  txc_httpguard_t *guard; /* the total deadline of a request's arrival */
  int port;
  uv_timer_t tick;
  uint64_t last_probe_ns;
  bool probing;
  bool closing;
  tc_parts_t close; /* the tick and a probe in flight */
  snap_t loop_snap; /* loop thread's working copy (probe results live here) */
  pthread_mutex_t mu;
  snap_t snap; /* under 'mu' */
};

/* ------------------------------------------------------------ loop side */

static void publish(tc_metrics_t *m) {
  snap_t *s = &m->loop_snap;
  tc_stats_read(m->ctx, &s->st);
  s->published_ns = uv_hrtime();
  pthread_mutex_lock(&m->mu);
  m->snap = *s;
  pthread_mutex_unlock(&m->mu);
}

/* Whether every version of 'expected' ("1,2,4") is in 'found' ("1,2,3,4"). */
static bool versions_present(const char *expected, const char *found, char *missing, size_t cap) {
  bool ok = true;
  size_t o = 0;
  missing[0] = '\0';
  const char *p = expected;
  while (*p) {
    char *end;
    long want = strtol(p, &end, 10);
    if (end == p) break;
    p = end;
    bool have = false;
    const char *q = found;
    while (*q) {
      long v = strtol(q, &end, 10);
      if (end == q) break;
      q = end;
      if (v == want) have = true;
      if (*q == ',') q++;
    }
    if (!have) {
      ok = false;
      if (o < cap) o += (size_t)snprintf(missing + o, cap - o, "%s%ld", o ? "," : "", want);
    }
    if (*p == ',') p++;
  }
  return ok;
}

static void on_probe(int status, const char *err, const tc_read_probe_t *p, void *arg) {
  tc_metrics_t *m = arg;
  m->probing = false;
  if (m->closing) {
    tc_parts_closed(&m->close);
    return;
  }
  snap_t *s = &m->loop_snap;
  s->probed = true;
  s->probed_ns = uv_hrtime();
  if (status == TC_READ_OK) {
    memset(s->sessions, 0, sizeof(s->sessions));
    for (int i = 0; i < p->nsessions; i++) {
      int st = p->sessions[i].status;
      if (st >= 0 && st < TXP_GS__MAX) s->sessions[st] = p->sessions[i].count;
    }
    s->sessions_valid = true;
    s->retry_depth = p->retry_depth;
    s->retry_due = p->retry_due;
    char missing[128];
    s->db_ok = true;
    s->schema_ok = versions_present(TC_SCHEMA_VERSIONS, p->schema_versions, missing, sizeof(missing));
    if (s->schema_ok)
      s->probe_error[0] = '\0';
    else
      snprintf(s->probe_error, sizeof(s->probe_error),
               "schema_version lacks tc version(s) %s (found \"%s\", expected \"%s\"): run scripts/db-migrate",
               missing, p->schema_versions, TC_SCHEMA_VERSIONS);
  } else if (status == TC_READ_ESTMT) {
    /* PostgreSQL answered, but the schema is not what this build reads. */
    s->db_ok = true;
    s->schema_ok = false;
    snprintf(s->probe_error, sizeof(s->probe_error), "store schema check failed: %s", err);
  } else {
    s->db_ok = false;
    s->sessions_valid = false;
    snprintf(s->probe_error, sizeof(s->probe_error), "PostgreSQL unreachable: %s",
             status == TC_READ_EBROKEN  ? "connection lost"
             : status == TC_READ_ENOMEM ? "out of memory"
                                        : "no connection");
  }
  publish(m);
}

static void start_probe(tc_metrics_t *m) {
  if (tc_read_probe(m->ctx->store, TC_METRICS_PROBE_MS * 2, on_probe, m) == 0) m->probing = true;
}

static void on_tick(uv_timer_t *t) {
  tc_metrics_t *m = t->data;
  if (m->closing) return;
  uint64_t now = uv_hrtime();
  if (!m->probing && now - m->last_probe_ns >= (uint64_t)TC_METRICS_PROBE_MS * 1000000u) {
    m->last_probe_ns = now;
    start_probe(m);
  }
  publish(m);
}

/* ---------------------------------------------------------- HTTP side */

typedef struct {
  char *p;
  size_t len, cap;
  bool failed;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf_t *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->failed = true;
      return;
    }
    if (b->p && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 8192;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->failed = true;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
}

static void head(sbuf_t *b, const char *name, const char *type, const char *help) {
  sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(sbuf_t *b, const char *name, const char *help, uint64_t v) {
  head(b, name, "counter", help);
  sb_printf(b, "%s %" PRIu64 "\n", name, v);
}

static void gauge(sbuf_t *b, const char *name, const char *help, double v) {
  head(b, name, "gauge", help);
  sb_printf(b, "%s %.17g\n", name, v);
}

/* A counter with one series per value of 'label': values[i] counted v[i]. */
static void counter_by(sbuf_t *b, const char *name, const char *help, const char *label, int n,
                       const char *const *values, const uint64_t *v) {
  head(b, name, "counter", help);
  for (int i = 0; i < n; i++) sb_printf(b, "%s{%s=\"%s\"} %" PRIu64 "\n", name, label, values[i], v[i]);
}

/* Statuses a live session can have (the gauge lists each, 0 included). */
static const int live_statuses[] = {
  TXP_GS_BEGIN,           TXP_GS_COMMITTING,          TXP_GS_COMMIT_RETRYING,
  TXP_GS_ROLLBACKING,     TXP_GS_ROLLBACK_RETRYING,   TXP_GS_TIMEOUT_ROLLBACKING,
  TXP_GS_TIMEOUT_ROLLBACK_RETRYING, TXP_GS_ASYNC_COMMITTING, TXP_GS_COMMIT_FAILED,
  TXP_GS_ROLLBACK_FAILED, TXP_GS_TIMEOUT_ROLLBACK_FAILED, TXP_GS_STOP_COMMIT_RETRY,
  TXP_GS_STOP_ROLLBACK_RETRY,
};

static bool ready(const snap_t *s, uint64_t now) {
  return s->st.serving && !s->st.stopping && s->probed && s->db_ok && s->schema_ok &&
         now - s->probed_ns < (uint64_t)TC_METRICS_STALE_MS * 2 * 1000000u;
}

/* A histogram of two series (label 'label' = values[0] / values[1]) over
 * the buckets tc_phase2_bounds (tc_hist_observe's: not cumulative). */
static void histogram2(sbuf_t *b, const char *name, const char *help, const char *label,
                       const char *const values[2], const uint64_t bucket[2][TC_PHASE2_BUCKETS],
                       const uint64_t count[2], const double sum[2]) {
  head(b, name, "histogram", help);
  for (int k = 0; k < 2; k++) {
    uint64_t cum = 0;
    for (int i = 0; i < TC_PHASE2_BUCKETS; i++) {
      cum += bucket[k][i];
      sb_printf(b, "%s_bucket{%s=\"%s\",le=\"%g\"} %" PRIu64 "\n", name, label, values[k], tc_phase2_bounds[i], cum);
    }
    sb_printf(b, "%s_bucket{%s=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", name, label, values[k], count[k]);
    sb_printf(b, "%s_sum{%s=\"%s\"} %.9f\n", name, label, values[k], sum[k]);
    sb_printf(b, "%s_count{%s=\"%s\"} %" PRIu64 "\n", name, label, values[k], count[k]);
  }
}

static void format_metrics(const snap_t *s, uint64_t now, sbuf_t *b) {
  const tc_node_stats_t *n = &s->st.counters;
  head(b, "txc_build_info", "gauge", "Build and node identity (always 1).");
  sb_printf(b, "txc_build_info{version=\"%s\",node_id=\"%d\"} 1\n", TXC_VERSION, s->st.node_id);

  counter(b, "txc_globals_begun_total", "Global transactions begun on this node.", n->begun);
  counter(b, "txc_globals_committed_total", "Commit decisions taken on this node.", n->committed);
  counter(b, "txc_globals_rolled_back_total", "Rollback decisions taken on this node (TM or operator).",
          n->rolled_back);
  counter(b, "txc_globals_timed_out_total", "Global transactions rolled back by timeout.", n->timed_out);
  counter(b, "txc_globals_commit_failed_total", "Sessions that ended CommitFailed (need an operator).",
          n->commit_failed);
  counter(b, "txc_globals_rollback_failed_total", "Sessions that ended *RollbackFailed (need an operator).",
          n->rollback_failed);
  gauge(b, "txc_begins_held", "Begins answered and not stored yet (store.begin_hold_ms).",
        (double)s->st.hold.held);
  gauge(b, "txc_requests_parked", "Requests waiting for the store to take their global's held begin.",
        (double)s->st.hold.parked);
  gauge(b, "txc_requests_retrying",
        "Requests that found no global of an xid another node made, waiting to run again after its hold.",
        (double)s->st.hold.retrying);
  counter_by(b, "txc_begins_stored_total", "Held begins stored, with their first registration or alone.", "how", 2,
             (const char *const[]){"with_registration", "alone"},
             (const uint64_t[]){s->st.hold.folded, s->st.hold.stored_alone});
  counter(b, "txc_branches_registered_total", "Branches registered.", n->registered);
  counter(b, "txc_branch_register_conflicts_total", "Branch registrations that met a held lock.",
          n->register_conflicts);
  counter(b, "txc_requests_total", "Requests served (TM and RM).", n->requests);
  counter(b, "txc_bad_requests_total", "Requests refused as invalid.", n->bad_requests);
  counter(b, "txc_not_owner_total",
          "Requests refused because the xid or branch belongs to another application or group.", n->not_owner);

  counter(b, "txc_lock_waits_total", "Registrations that waited for a global lock.", n->lock_waits);
  head(b, "txc_lock_wait_seconds_total", "counter", "Time spent waiting for global locks (granted waits).");
  sb_printf(b, "txc_lock_wait_seconds_total %.3f\n", (double)n->lock_wait_ms_total / 1000.0);
  counter(b, "txc_lock_wait_timeouts_total", "Lock waits that timed out.", n->lock_wait_timeouts);
  gauge(b, "txc_lock_waiters", "Registrations waiting for a lock on this node now.", (double)s->st.lock_waiters);

  counter(b, "txc_phase2_calls_total", "BranchCommit/BranchRollback calls to resource managers.", n->phase2_calls);
  counter_by(b, "txc_phase2_failures_total", "Phase-two branch calls that failed, by kind.", "kind", 3,
             (const char *const[]){"retryable", "unretryable", "no_rm"},
             (const uint64_t[]){n->phase2_retryable, n->phase2_unretryable, n->phase2_no_rm});
  counter(b, "txc_phase2_forwarded_total", "Branch calls relayed through a peer node (cluster bus).",
          n->phase2_forwarded);
  gauge(b, "txc_phase2_active", "Phase-two drives in progress on this node.", (double)n->phase2_active);
  static const char *const lw_outcome[2] = {"granted", "refused"};
  histogram2(b, "txc_lock_wait_duration_seconds",
             "Waits for a global lock (registrations and locking reads), by outcome: granted or refused.", "outcome",
             lw_outcome, n->lock_wait_bucket, n->lock_wait_count, n->lock_wait_seconds);
  static const char *const decision[2] = {"commit", "rollback"};
  histogram2(b, "txc_phase2_duration_seconds", "Duration of one phase-two drive of a global transaction.",
             "decision", decision, n->phase2_bucket, n->phase2_count, n->phase2_seconds);

  if (s->sessions_valid) {
    head(b, "txc_active_sessions", "gauge", "Unfinished global transactions in the store, by status.");
    for (size_t i = 0; i < sizeof(live_statuses) / sizeof(live_statuses[0]); i++)
      sb_printf(b, "txc_active_sessions{status=\"%s\"} %" PRId64 "\n", txp_global_status_name(live_statuses[i]),
                s->sessions[live_statuses[i]]);
    gauge(b, "txc_retry_queue_depth", "Sessions with a phase-two retry (or lease) scheduled.", (double)s->retry_depth);
    gauge(b, "txc_retry_queue_due", "Sessions whose phase-two retry is due now.", (double)s->retry_due);
  }

  const tc_store_stats_t *st = &s->st.store;
  counter(b, "txc_store_batches_total", "Group-commit batches run.", st->batches);
  static const char *const kinds[TC_OP__KINDS] = {"begin", "register", "decide", "phase2"};
  counter_by(b, "txc_store_ops_total", "Store operations, by kind.", "kind", TC_OP__KINDS, kinds, st->ops_by_kind);
  head(b, "txc_store_op_seconds", "histogram",
       "Time from an operation's submission to its result (queue wait plus its batch), by kind.");
  for (int i = 0; i < TC_OP__KINDS; i++) {
    uint64_t cum = 0;
    for (int j = 0; j < TC_STORE_OP_BUCKETS; j++) {
      cum += st->op_bucket[i][j];
      sb_printf(b, "txc_store_op_seconds_bucket{kind=\"%s\",le=\"%g\"} %" PRIu64 "\n", kinds[i],
                tc_store_op_bounds[j], cum);
    }
    sb_printf(b, "txc_store_op_seconds_bucket{kind=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", kinds[i], st->op_count[i]);
    sb_printf(b, "txc_store_op_seconds_sum{kind=\"%s\"} %.6f\n", kinds[i], st->op_seconds_by_kind[i]);
    sb_printf(b, "txc_store_op_seconds_count{kind=\"%s\"} %" PRIu64 "\n", kinds[i], st->op_count[i]);
  }
  head(b, "txc_store_batch_duration_seconds", "summary", "Duration of one group-commit batch (one transaction).");
  sb_printf(b, "txc_store_batch_duration_seconds_sum %.6f\n", st->batch_ms_total / 1000.0);
  sb_printf(b, "txc_store_batch_duration_seconds_count %" PRIu64 "\n", st->batches);
  head(b, "txc_store_batch_size", "summary", "Operations per group-commit batch.");
  sb_printf(b, "txc_store_batch_size_sum %" PRIu64 "\n", st->ops);
  sb_printf(b, "txc_store_batch_size_count %" PRIu64 "\n", st->batches);
  gauge(b, "txc_store_queue_length", "Operations waiting for a batch.", (double)st->queue_len);
  gauge(b, "txc_store_queue_peak", "Longest queue seen.", (double)st->queue_peak);
  counter(b, "txc_store_batch_retries_total", "Batches run again (deadlock, or one op at a time).",
          st->batch_retries);
  counter(b, "txc_store_deadlocks_total", "Batches that met a deadlock or serialization failure.", st->deadlocks);
  counter(b, "txc_store_op_failures_total", "Operations that failed in the store.", st->op_failures);
  counter(b, "txc_store_unknown_batches_total",
          "Batches whose connection broke in flight (outcome unknown, read back from the store).",
          st->unknown_batches);
  counter_by(b, "txc_store_unknown_ops_total",
             "Operations of such batches, by what reading the store found: applied (answered as their batch "
             "would have), redone (not applied: run again), failed (no reading in time, or broken too often).",
             "resolution", 3, (const char *const[]){"applied", "redone", "failed"},
             (const uint64_t[]){st->unknown_applied, st->unknown_redone, st->unknown_failed});
  gauge(b, "txc_store_connections_ready", "PostgreSQL connections ready (writers and readers).",
        (double)s->st.store_ready_conns);

  if (s->st.has_server) {
    const tc_server_stats_t *sv = &s->st.server;
    head(b, "txc_connections", "gauge", "Registered client connections, by role.");
    sb_printf(b, "txc_connections{role=\"rm\"} %d\n", sv->rms);
    sb_printf(b, "txc_connections{role=\"tm\"} %d\n", sv->tms);
    gauge(b, "txc_connections_open", "Open client connections (registered or not).", (double)sv->connections);
    counter(b, "txc_connections_accepted_total", "Client connections accepted.", sv->accepted);
    counter(b, "txc_connections_refused_total", "Client connections refused (limit).", sv->refused);
    counter(b, "txc_connections_refused_per_address_total",
            "Client connections refused because their address held its share (server.max_connections_per_address).",
            sv->refused_per_address);
    counter_by(b, "txc_frames_total", "Protocol frames, by direction.", "direction", 2,
               (const char *const[]){"in", "out"}, (const uint64_t[]){sv->frames_in, sv->frames_out});
    counter(b, "txc_bad_frames_total", "Frames that could not be decoded (bad magic, size, body).", sv->bad_frames);
    counter(b, "txc_busy_replies_total", "Requests answered BUSY (too many in flight).", sv->busy_replies);
    counter(b, "txc_auth_failures_total", "Registrations refused: unknown application, wrong secret or wrong token.", sv->auth_failures);
    counter(b, "txc_version_mismatches_total", "Peers with another protocol major version.",
            sv->version_mismatches);
    counter(b, "txc_unregistered_closed_total",
            "Connections closed before registering: another frame first, or no registration in time.",
            sv->unregistered_closed);
  }

  if (s->st.has_bus) {
    const tc_bus_stats_t *bs = &s->st.bus;
    gauge(b, "txc_bus_peers_up", "Peer nodes heard on the cluster bus within 3 heartbeats.", (double)bs->peers_up);
    counter_by(b, "txc_bus_messages_total", "Cluster bus messages, by direction.", "direction", 2,
               (const char *const[]){"out", "in"}, (const uint64_t[]){bs->sent, bs->received});
    counter(b, "txc_bus_send_dropped_total", "Cluster bus messages not sent (full pipe, or could not seal).",
            bs->send_dropped);
    const char *reasons[TC_BUS_REJECT_N];
    for (int i = 0; i < TC_BUS_REJECT_N; i++) reasons[i] = tc_bus_reject_name(i);
    counter_by(b, "txc_bus_rejected_total",
               "Cluster bus messages dropped, by reason (malformed, bad_mac, not_member, replayed, stale, unexpected).",
               "reason", TC_BUS_REJECT_N, reasons, bs->rejected);
    counter_by(b, "txc_bus_forwards_total", "Phase-two calls this node relayed through peers, by outcome.", "outcome",
               3, (const char *const[]){"answered", "no_rm", "timed_out"},
               (const uint64_t[]){bs->forwards_answered, bs->forwards_no_rm, bs->forwards_timed_out});
    counter(b, "txc_bus_forwards_served_total", "Phase-two calls relayed for peers to a local RM.",
            bs->forwards_served);
  }

  gauge(b, "txc_leader", "1 while this node holds the recovery leadership.", s->st.leader ? 1 : 0);
  if (s->st.has_recovery) {
    counter(b, "txc_leader_terms_total", "Times this node became the leader.", s->st.rec.leader_terms);
    counter(b, "txc_recovery_timeouts_total", "Timed-out sessions found by the leader.", s->st.rec.timed_out);
    counter(b, "txc_recovery_retries_total", "Phase-two retries claimed by the leader.", s->st.rec.retried);
  }
  if (s->st.has_admin) {
    counter(b, "txc_admin_requests_total", "Admin socket requests.", s->st.admin.requests);
    counter(b, "txc_admin_repairs_total", "Operator repairs applied.", s->st.admin.repairs);
    counter(b, "txc_admin_refused_total", "Operator repairs refused.", s->st.admin.refused);
    counter(b, "txc_admin_denied_total", "Admin connections refused by peer credentials.", s->st.admin.denied);
  }
  gauge(b, "txc_store_reachable", "1 if PostgreSQL answered the last probe.", s->db_ok ? 1 : 0);
  gauge(b, "txc_schema_ok", "1 if schema_version holds every tc version this build expects.",
        s->schema_ok ? 1 : 0);
  gauge(b, "txc_ready", "1 when /readyz answers 200.", ready(s, now) ? 1 : 0);
  gauge(b, "txc_snapshot_age_seconds", "Age of the loop's last published snapshot.",
        (double)(now - s->published_ns) / 1e9);
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, char *body, size_t len,
                               const char *ctype) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  enum MHD_Result ret = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned code, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned code, const char *fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof(tmp)) n = (int)sizeof(tmp) - 1;
  char *body = malloc((size_t)n + 1);
  if (!body) return MHD_NO;
  memcpy(body, tmp, (size_t)n + 1);
  return respond(conn, code, body, (size_t)n, "text/plain; charset=utf-8");
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
  tc_metrics_t *m = cls;
  (void)version;
  (void)upload_data;
  (void)con_cls;
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method %s not allowed: use GET\n", method);
  if (*upload_size) return respond_text(conn, MHD_HTTP_BAD_REQUEST, "unexpected request body\n");
  txc_httpguard_received(m->guard, conn);
  snap_t *s = malloc(sizeof(*s));
  if (!s) return MHD_NO;
  pthread_mutex_lock(&m->mu);
  *s = m->snap;
  pthread_mutex_unlock(&m->mu);
  uint64_t now = uv_hrtime();
  enum MHD_Result ret;
  if (strcmp(url, "/metrics") == 0) {
    sbuf_t b = {0};
    format_metrics(s, now, &b);
    counter(&b, "txc_metrics_requests_cut_total",
            "Requests to this listener cut at the deadline (METRICS_REQUEST_DEADLINE_MS) before they had arrived.",
            txc_httpguard_cut(m->guard));
    txc_procstat_t ps;
    char pbuf[2048];
    if (txc_procstat_read(&ps) == 0 && txc_procstat_format(&ps, pbuf, sizeof(pbuf)) > 0) sb_printf(&b, "%s", pbuf);
    if (b.failed) {
      free(b.p);
      ret = MHD_NO;
    } else {
      ret = respond(conn, MHD_HTTP_OK, b.p, b.len, "text/plain; version=0.0.4; charset=utf-8");
    }
  } else if (strcmp(url, "/healthz") == 0) {
    double age_ms = s->published_ns ? (double)(now - s->published_ns) / 1e6 : -1;
    if (s->published_ns && age_ms < TC_METRICS_STALE_MS)
      ret = respond_text(conn, MHD_HTTP_OK, "ok: loop alive (snapshot %.0f ms old)\n", age_ms);
    else
      ret = respond_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "unhealthy: the event loop published nothing for %.0f ms\n",
                         age_ms);
  } else if (strcmp(url, "/readyz") == 0) {
    if (ready(s, now)) {
      ret = respond_text(conn, MHD_HTTP_OK, "ready: serving, PostgreSQL reachable, schema tc %s\n", TC_SCHEMA_VERSIONS);
    } else {
      const char *why = !s->st.serving || s->st.stopping ? "not serving (starting or stopping)"
                        : !s->probed              ? "PostgreSQL not probed yet"
                        : s->probe_error[0]       ? s->probe_error
                                                  : "last PostgreSQL probe is too old";
      ret = respond_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "not ready: %s\n", why);
    }
  } else {
    ret = respond_text(conn, MHD_HTTP_NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n");
  }
  free(s);
  return ret;
}

/* printf-style: lets the compiler check the forwarding of fmt to vsnprintf. */
__attribute__((format(printf, 2, 0))) static void mhd_log(void *arg, const char *fmt, va_list ap) {
  char msg[512];
  (void)arg;
  vsnprintf(msg, sizeof(msg), fmt, ap);
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
  tc_log_warn("metrics http: %s", msg);
}

/* ------------------------------------------------------------- lifecycle */

#define METRICS_CONNECTIONS 256 /* below FD_SETSIZE: MHD's internal thread may use select() */
#define METRICS_PER_ADDRESS 8
#define METRICS_IDLE_S 5
#define METRICS_REQUEST_DEADLINE_MS 5000 /* from connect (or the last answer) to the whole request */

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)con_cls;
  (void)toe;
  txc_httpguard_completed(((tc_metrics_t *)cls)->guard, conn);
}

int tc_metrics_start(tc_ctx_t *ctx, tc_metrics_t **out, char *err, size_t errlen) {
  *out = NULL;
  char host[256], portstr[16];
  int port;
  if (tc_config_split_addr(ctx->cfg->metrics_listen, host, sizeof(host), &port) != 0) {
    snprintf(err, errlen, "invalid metrics.listen \"%s\": expected host:port", ctx->cfg->metrics_listen);
    return TXP_EINVALID_ARG;
  }
  /* "[::1]:9100" */
  if (host[0] == '[' && host[strlen(host) - 1] == ']') {
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = '\0';
  }
  snprintf(portstr, sizeof(portstr), "%d", port);
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
  int gr = getaddrinfo(host[0] ? host : NULL, portstr, &hints, &ai);
  if (gr != 0 || !ai) {
    snprintf(err, errlen, "could not resolve metrics.listen host \"%s\": %s", host, gai_strerror(gr));
    return TXP_EINVALID_ARG;
  }
  tc_metrics_t *m = calloc(1, sizeof(*m));
  if (!m) {
    freeaddrinfo(ai);
    snprintf(err, errlen, "out of memory");
    return TXP_ENOMEM;
  }
  m->ctx = ctx;
  pthread_mutex_init(&m->mu, NULL);
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  /* A first snapshot before the HTTP thread can read one. */
  publish(m);
  /* Probes must get through while strangers dribble headers (security
   * review, finding 5): one address holds at most METRICS_PER_ADDRESS
   * connections, all of them METRICS_CONNECTIONS, and a connection silent
   * for METRICS_IDLE_S is closed, and one whose request has not fully
   * arrived METRICS_REQUEST_DEADLINE_MS after it opened (or its last
   * answer) is cut (txc_httpguard.h).  64 slow sockets from one address
   * then leave room for the probes of every other address, and slow
   * sockets from many addresses are gone within the deadline. */
  m->guard = txc_httpguard_new(METRICS_CONNECTIONS, METRICS_REQUEST_DEADLINE_MS);
  m->mhd = !m->guard ? NULL
                     : MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_http, m, MHD_OPTION_EXTERNAL_LOGGER,
                                        mhd_log, NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                                        (unsigned)METRICS_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                        (unsigned)METRICS_PER_ADDRESS, MHD_OPTION_CONNECTION_TIMEOUT,
                                        (unsigned)METRICS_IDLE_S, MHD_OPTION_NOTIFY_CONNECTION, txc_httpguard_notify,
                                        m->guard, MHD_OPTION_NOTIFY_COMPLETED, on_completed, m, MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!m->mhd) {
    txc_httpguard_free(m->guard);
    snprintf(err, errlen, "could not listen for metrics on \"%s\" (address in use or not local?)",
             ctx->cfg->metrics_listen);
    pthread_mutex_destroy(&m->mu);
    free(m);
    return TXP_EINVALID_ARG;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_BIND_PORT);
  m->port = info ? (int)info->port : port;
  uv_timer_init(ctx->loop, &m->tick);
  m->tick.data = m;
  uv_timer_start(&m->tick, on_tick, 0, TC_METRICS_PUBLISH_MS);
  tc_log_info("metrics on http://%s:%d/metrics (also /healthz, /readyz)", host, m->port);
  *out = m;
  return 0;
}

int tc_metrics_port(const tc_metrics_t *m) { return m ? m->port : -1; }

static void metrics_free(void *arg) {
  tc_metrics_t *m = arg;
  pthread_mutex_destroy(&m->mu);
  free(m);
}

static void on_tick_closed(uv_handle_t *h) {
  tc_metrics_t *m = h->data;
  tc_parts_closed(&m->close);
}

void tc_metrics_close(tc_metrics_t *m, void (*done)(void *), void *arg) {
  m->closing = true;
  /* Joins the HTTP thread: no handler runs after this. */
  MHD_stop_daemon(m->mhd);
  m->mhd = NULL;
  txc_httpguard_free(m->guard);
  m->guard = NULL;
  tc_parts_start(&m->close, 1 + (m->probing ? 1 : 0), metrics_free, m, done, arg);
  uv_close((uv_handle_t *)&m->tick, on_tick_closed);
}
