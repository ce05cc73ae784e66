/* txc_failpoint: see txc_failpoint.h. */
#include "txc_failpoint.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const txc_failpoint_names[] = {
  /* tcd */
  "tc.begin.after_store",       /* global row durable, TM not answered */
  "tc.register.after_store",    /* branch and its locks durable, RM not answered */
  "tc.commit.before_decision",  /* GlobalCommit received, nothing stored */
  "tc.commit.after_decision",   /* commit decision durable, no branch told */
  "tc.rollback.after_decision", /* rollback decision durable, no branch told */
  "tc.phase2.after_acks",       /* every branch acknowledged commit, not recorded */
  /* tcd's store (action "fail": the batch's connection is treated as lost) */
  "tc.store.begin.reply_lost",    /* a batch with begins committed, its answer lost */
  "tc.store.register.reply_lost", /* a batch with registrations committed, its answer lost */
  "tc.store.decide.reply_lost",   /* a batch with decisions committed, its answer lost */
  "tc.store.begin.aborted",       /* a batch with begins lost before its COMMIT */
  "tc.store.register.aborted",    /* a batch with registrations lost before its COMMIT */
  "tc.store.decide.aborted",      /* a batch with decisions lost before its COMMIT */
  /* librmclient (AT) */
  "rm.at.after_register",       /* branch registered, local transaction open */
  "rm.at.after_local_commit",   /* local COMMIT done, not reported to the caller */
  /* librmclient (TCC) */
  "rm.tcc.after_register",      /* TCC branch registered, its fence row not yet written */
  /* librmclient (XA) */
  "rm.xa.after_register",       /* XA branch registered, its fence row not yet written */
  "rm.xa.after_prepare",        /* PREPARE TRANSACTION done, not returned to the caller */
  /* the demo services (examples/) */
  "svc.order.fin.before_commit",  /* the purchase's branches committed locally, no GlobalCommit */
  "svc.order.fin.before_publish", /* pay/cancel/expire committed with its outbox event, not published */
  "svc.outbox.after_xadd",        /* the relay's XADDs done, the outbox not marked published */
  "svc.consumer.after_apply",     /* a consumer applied an event in its transaction, not committed */
  "svc.consumer.after_commit",    /* a consumer committed an event's effect, not acknowledged */
  NULL,
};

#define NPOINTS (sizeof(txc_failpoint_names) / sizeof(txc_failpoint_names[0]) - 1)
#define MAX_SPEC TXC_FAILPOINT_MAX_SPEC

typedef struct {
  txp_fp_action_t action;
  unsigned long countdown; /* fires when it reaches 0 */
} point_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static point_t g_points[NPOINTS];
static atomic_int g_armed; /* number of armed points: the fast path */

bool txc_failpoint_compiled(void) {
#ifdef TX_FAILPOINTS
  return true;
#else
  return false;
#endif
}

static int find(const char *name, size_t len) {
  for (size_t i = 0; i < NPOINTS; i++)
    if (strlen(txc_failpoint_names[i]) == len && memcmp(txc_failpoint_names[i], name, len) == 0) return (int)i;
  return -1;
}

static int parse_action(const char *s, size_t len, txp_fp_action_t *a) {
  static const struct { const char *name; txp_fp_action_t a; } acts[] = {
    {"off", TXC_FP_OFF}, {"abort", TXC_FP_ABORT}, {"stop", TXC_FP_STOP}, {"trace", TXC_FP_TRACE},
    {"fail", TXC_FP_FAIL},
  };
  for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++)
    if (strlen(acts[i].name) == len && memcmp(acts[i].name, s, len) == 0) {
      *a = acts[i].a;
      return 0;
    }
  return -1;
}

/* One element "name=action[@N]" of [s, s+len). */
static int parse_one(const char *s, size_t len, int *idx, point_t *p, char *err, size_t errlen) {
  const char *eq = memchr(s, '=', len);
  if (!eq) {
    snprintf(err, errlen, "failpoint \"%.*s\": expected name=action[@N]", (int)len, s);
    return -1;
  }
  size_t nlen = (size_t)(eq - s);
  if ((*idx = find(s, nlen)) < 0) {
    int w = snprintf(err, errlen, "unknown failpoint \"%.*s\" (known:", (int)nlen, s);
    for (size_t i = 0; i < NPOINTS && w >= 0 && (size_t)w < errlen; i++)
      w += snprintf(err + w, errlen - (size_t)w, "%s %s", i ? "," : "", txc_failpoint_names[i]);
    if (w >= 0 && (size_t)w < errlen) snprintf(err + w, errlen - (size_t)w, ")");
    return -1;
  }
  const char *act = eq + 1, *end = s + len;
  const char *at = memchr(act, '@', (size_t)(end - act));
  size_t alen = (size_t)((at ? at : end) - act);
  if (parse_action(act, alen, &p->action) != 0) {
    snprintf(err, errlen, "failpoint \"%.*s\": unknown action \"%.*s\" (abort, stop, trace, fail or off)",
             (int)nlen, s, (int)alen, act);
    return -1;
  }
  p->countdown = 1;
  if (at) {
    char num[24];
    size_t dlen = (size_t)(end - at - 1);
    char *stop = NULL;
    if (dlen == 0 || dlen >= sizeof(num)) goto bad_count;
    memcpy(num, at + 1, dlen);
    num[dlen] = '\0';
    if (num[0] < '0' || num[0] > '9') goto bad_count;
    errno = 0;
    unsigned long n = strtoul(num, &stop, 10);
    if (errno || *stop || n == 0 || n > 1000000000ul) goto bad_count;
    p->countdown = n;
  }
  return 0;
bad_count:
  snprintf(err, errlen, "failpoint \"%.*s\": the hit count after '@' must be 1..1000000000", (int)nlen, s);
  return -1;
}

/* Parses SPEC into next[]/set[] without arming anything. */
static int parse_spec(const char *spec, point_t *next, bool *set, char *err, size_t errlen) {
  if (!spec || !spec[0]) {
    snprintf(err, errlen, "empty failpoint spec: expected name=action[@N][,...]");
    return -1;
  }
  size_t total = strlen(spec);
  if (total > MAX_SPEC) {
    snprintf(err, errlen, "failpoint spec is %zu bytes, the limit is %d", total, MAX_SPEC);
    return -1;
  }
  const char *s = spec;
  while (*s) {
    const char *comma = strchr(s, ',');
    size_t len = comma ? (size_t)(comma - s) : strlen(s);
    int idx;
    point_t p;
    if (len == 0) {
      snprintf(err, errlen, "empty element in failpoint spec \"%.200s\"", spec);
      return -1;
    }
    if (parse_one(s, len, &idx, &p, err, errlen) != 0) return -1;
    next[idx] = p;
    set[idx] = true;
    s += len + (comma ? 1 : 0);
    if (comma && !*s) {
      snprintf(err, errlen, "failpoint spec ends with a comma");
      return -1;
    }
  }
  return 0;
}

int txc_failpoint_check(const char *spec, char *err, size_t errlen) {
  point_t next[NPOINTS];
  bool set[NPOINTS] = {false};
  return parse_spec(spec, next, set, err, errlen);
}

int txc_failpoint_arm(const char *spec, char *err, size_t errlen) {
  point_t next[NPOINTS];
  bool set[NPOINTS] = {false};
  if (parse_spec(spec, next, set, err, errlen) != 0) return -1; /* all or nothing */
  pthread_mutex_lock(&g_mu);
  for (size_t i = 0; i < NPOINTS; i++) {
    if (!set[i]) continue;
    bool was = g_points[i].action != TXC_FP_OFF;
    g_points[i] = next[i];
    bool now = next[i].action != TXC_FP_OFF;
    if (was != now) atomic_fetch_add(&g_armed, now ? 1 : -1);
  }
  pthread_mutex_unlock(&g_mu);
  return 0;
}

int txc_failpoint_arm_env(char *err, size_t errlen) {
  const char *spec = getenv("TX_FAILPOINTS");
  if (!spec || !spec[0]) return 0;
  if (!txc_failpoint_compiled()) {
    snprintf(err, errlen, "TX_FAILPOINTS is set but this build has no failpoints (configure with -DTX_FAILPOINTS=ON)");
    return -1;
  }
  return txc_failpoint_arm(spec, err, errlen);
}

txp_fp_action_t txc_failpoint_hit(const char *name) {
  if (atomic_load_explicit(&g_armed, memory_order_relaxed) == 0) return TXC_FP_OFF;
  int idx = find(name, strlen(name));
  if (idx < 0) return TXC_FP_OFF;
  txp_fp_action_t fire = TXC_FP_OFF;
  pthread_mutex_lock(&g_mu);
  point_t *p = &g_points[idx];
  if (p->action != TXC_FP_OFF && --p->countdown == 0) {
    fire = p->action;
    p->action = TXC_FP_OFF;
    atomic_fetch_sub(&g_armed, 1);
  }
  pthread_mutex_unlock(&g_mu);
  if (fire == TXC_FP_OFF) return fire;
  /* One line, written at once: the fault driver greps for it. */
  char line[160];
  int n = snprintf(line, sizeof(line), "failpoint %s: %s (pid %ld)\n", name,
                   fire == TXC_FP_ABORT  ? "abort"
                   : fire == TXC_FP_STOP ? "stop"
                   : fire == TXC_FP_FAIL ? "fail"
                                         : "trace",
                   (long)getpid());
  if (n > 0) {
    ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
    (void)w;
  }
  if (fire == TXC_FP_ABORT) raise(SIGKILL);
  if (fire == TXC_FP_STOP) raise(SIGSTOP);
  return fire;
}

size_t txc_failpoint_list(char *out, size_t cap) {
  static const char *const act[] = {"off", "abort", "stop", "trace", "fail"};
  size_t len = 0;
  if (cap == 0) return 0;
  out[0] = '\0';
  pthread_mutex_lock(&g_mu);
  for (size_t i = 0; i < NPOINTS && len + 1 < cap; i++) {
    const point_t *p = &g_points[i];
    int n = snprintf(out + len, cap - len, "%s %s %lu\n", txc_failpoint_names[i], act[p->action],
                     p->action == TXC_FP_OFF ? 0ul : p->countdown);
    if (n < 0) break;
    len += (size_t)n < cap - len ? (size_t)n : cap - len - 1;
  }
  pthread_mutex_unlock(&g_mu);
  return len;
}
