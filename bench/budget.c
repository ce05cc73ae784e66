/* budget.c - see budget.h. */
#include "budget.h"

#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pgstat.h"
#include "svc_http.h"
#include "svc_redis.h"

static const char *const comp_names[BUDGET_NCOMP] = {"postgres", "tcd", "order_service", "stock_service", "redis",
                                                     "load_generator"};

/* ------------------------------------------------------------ processes */

/* utime + stime (+ cutime + cstime when 'children'), in clock ticks, of
 * 'pid'; its parent in *ppid (may be NULL).  -1 if unreadable. */
static long long proc_ticks(long pid, bool children, long *ppid) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')'); /* after the command name */
  if (!p) return -1;
  /* fields from 3 on: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime */
  char state;
  long pp;
  unsigned long long ut, st;
  long long cut, cst;
  if (sscanf(p + 2, "%c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld", &state, &pp, &ut, &st, &cut,
             &cst) != 6)
    return -1;
  if (ppid) *ppid = pp;
  return (long long)(ut + st) + (children ? cut + cst : 0);
}

/* Context switches of every thread of 'pid' (0 if unreadable). */
static long long proc_ctx_switches(long pid) {
  char path[96];
  snprintf(path, sizeof(path), "/proc/%ld/task", pid);
  DIR *d = opendir(path);
  if (!d) return 0;
  long long sum = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    char sp[320], line[128];
    snprintf(sp, sizeof(sp), "/proc/%ld/task/%s/status", pid, e->d_name);
    FILE *f = fopen(sp, "r");
    if (!f) continue;
    while (fgets(line, sizeof(line), f)) {
      long long v;
      if (sscanf(line, "voluntary_ctxt_switches: %lld", &v) == 1 ||
          sscanf(line, "nonvoluntary_ctxt_switches: %lld", &v) == 1)
        sum += v;
    }
    fclose(f);
  }
  closedir(d);
  return sum;
}

static long env_pid(const char *name) {
  const char *v = getenv(name);
  return v && *v ? atol(v) : 0;
}

static void add_proc(budget_sample_t *s, int comp, long pid, bool children) {
  long long t = pid ? proc_ticks(pid, children, NULL) : -1;
  if (t > 0) s->cpu_ticks[comp] += t;
  if (pid) s->ctx_switches[comp] += proc_ctx_switches(pid);
}

static void sample_procs(budget_sample_t *s) {
  long pg = env_pid("PG_PID"), redis = env_pid("REDIS_PID"), order = env_pid("ORDER_PID"),
       stock = env_pid("STOCK_PID");
  const char *tcs = getenv("TC_PIDS");
  s->have_procs = pg && order && stock && tcs;
  if (!s->have_procs) return;
  add_proc(s, BUDGET_PG, pg, true);
  DIR *d = opendir("/proc");
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) { /* the backends */
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    long pid = atol(e->d_name), pp = 0;
    long long t = proc_ticks(pid, false, &pp);
    if (t >= 0 && pp == pg) {
      s->cpu_ticks[BUDGET_PG] += t;
      s->ctx_switches[BUDGET_PG] += proc_ctx_switches(pid);
    }
  }
  if (d) closedir(d);
  for (const char *p = tcs; *p;) {
    add_proc(s, BUDGET_TCD, atol(p), true);
    p = strchr(p, ',');
    if (!p) break;
    p++;
  }
  add_proc(s, BUDGET_ORDER, order, true);
  add_proc(s, BUDGET_STOCK, stock, true);
  if (redis) add_proc(s, BUDGET_REDIS, redis, true);
  add_proc(s, BUDGET_SELF, (long)getpid(), false);
}

static long long machine_ctx_switches(void) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return -1;
  char line[256];
  long long v = -1;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "ctxt %lld", &v) == 1) break;
  fclose(f);
  return v;
}

/* ----------------------------------------------------------- PostgreSQL */

static void sample_pg(budget_sample_t *s) {
  static const char *const urls[] = {"ORDERS_PG_URL", "STOCK_PG_URL", "TC_PG_URL", "EVENTS_PG_URL"};
  for (size_t i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) pgstat_add_db(&s->pg, getenv(urls[i]));
  if (s->pg.ndb) pgstat_sample(&s->pg, getenv("TC_PG_URL"));
}

/* ----------------------------------------------- Redis, tcd, stock-service */

static long long sample_redis(void) {
  const char *url = svc_redis_env_url();
  if (!url) return -1;
  char err[256];
  redisContext *c = svc_redis_connect(url, 2000, err, sizeof(err));
  if (!c) return -1;
  long long v = -1;
  redisReply *r = svc_redis_cmd(c, err, sizeof(err), "INFO stats");
  if (r && r->type == REDIS_REPLY_STRING) {
    const char *p = strstr(r->str, "total_commands_processed:");
    if (p) v = atoll(p + strlen("total_commands_processed:"));
  }
  if (r) freeReplyObject(r);
  redisFree(c);
  return v;
}

/* Frames received by every node (tcctl stats --json, "server.frames_in"). */
static long long sample_tc_frames(void) {
  const char *socks = getenv("TC_ADMIN_SOCKETS"), *bin = getenv("TX_BIN_DIR");
  if (!socks || !*socks || !bin) return -1;
  long long sum = 0;
  for (const char *p = socks; *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "'%s/tcctl' --json --timeout 5 --socket '%.*s' stats 2>/dev/null", bin, (int)len, p);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    json_error_t je;
    json_t *j = json_loadf(f, 0, &je);
    pclose(f);
    json_t *v = json_object_get(json_object_get(j, "server"), "frames_in");
    if (!json_is_integer(v)) {
      json_decref(j);
      return -1; /* a node that does not answer: no figure rather than a wrong one */
    }
    sum += (long long)json_integer_value(v);
    json_decref(j);
    if (!comma) break;
    p = comma + 1;
  }
  return sum;
}

/* The sum of txc_client_http_responses_total on STOCK_URL/metrics. */
static long long sample_stock_http(void) {
  const char *base = getenv("STOCK_URL");
  if (!base || !*base) return -1;
  char url[512], err[256];
  snprintf(url, sizeof(url), "%s/metrics", base);
  char *text = svc_http_get_text(url, 3000, err, sizeof(err));
  if (!text) return -1;
  long long sum = 0;
  for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (strncmp(line, "txc_client_http_responses_total", 31) != 0) continue;
    const char *sp = strrchr(line, ' ');
    if (sp) sum += atoll(sp + 1);
  }
  free(text);
  return sum;
}

/* ------------------------------------------------------------------ API */

void budget_sample(budget_sample_t *out) {
  memset(out, 0, sizeof(*out));
  sample_procs(out);
  out->machine_ctx_switches = machine_ctx_switches();
  sample_pg(out);
  out->redis_commands = sample_redis();
  out->tc_frames_in = sample_tc_frames();
  out->stock_http = sample_stock_http();
}

static json_t *per(long long d, long long orders) {
  return json_real(round((double)d / (double)orders * 1000.0) / 1000.0);
}

json_t *budget_json(const budget_sample_t *a, const budget_sample_t *b, long long orders) {
  if (orders <= 0) return NULL;
  json_t *j = json_object();
  if (a->have_procs && b->have_procs) {
    double tick_ms = 1000.0 / (double)sysconf(_SC_CLK_TCK);
    json_t *cpu = json_object(), *cs = json_object();
    double cpu_total = 0;
    long long cs_total = 0;
    for (int i = 0; i < BUDGET_NCOMP; i++) {
      double ms = (double)(b->cpu_ticks[i] - a->cpu_ticks[i]) * tick_ms / (double)orders;
      json_object_set_new(cpu, comp_names[i], json_real(round(ms * 1000) / 1000));
      long long d = b->ctx_switches[i] - a->ctx_switches[i];
      json_object_set_new(cs, comp_names[i], per(d, orders));
      if (i != BUDGET_SELF) {
        cpu_total += ms;
        cs_total += d;
      }
    }
    json_object_set_new(cpu, "total", json_real(round(cpu_total * 1000) / 1000));
    json_object_set_new(cs, "total", per(cs_total, orders));
    json_object_set_new(j, "cpu_ms", cpu);
    json_object_set_new(j, "context_switches", cs);
  }
  if (a->machine_ctx_switches >= 0 && b->machine_ctx_switches >= 0)
    json_object_set_new(j, "machine_context_switches", per(b->machine_ctx_switches - a->machine_ctx_switches, orders));
  const pgstat_t *pa = &a->pg, *pb = &b->pg;
  if (pa->ok && pb->ok) {
    json_object_set_new(j, "wal_bytes", per(pb->wal_bytes - pa->wal_bytes, orders));
    json_object_set_new(j, "wal_records", per(pb->wal_records - pa->wal_records, orders));
    json_object_set_new(j, "wal_fpi", per(pb->wal_fpi - pa->wal_fpi, orders));
    json_object_set_new(j, "wal_syncs", per(pb->wal_sync - pa->wal_sync, orders));
    json_t *tx = json_object(), *st = json_object(), *rr = json_object();
    long long tx_total = 0, st_total = 0, rr_total = 0;
    bool st_known = true;
    for (int k = 0; k < pa->ndb && k < pb->ndb; k++) {
      if (pa->xacts[k] >= 0 && pb->xacts[k] >= 0) {
        json_object_set_new(tx, pa->db[k], per(pb->xacts[k] - pa->xacts[k], orders));
        tx_total += pb->xacts[k] - pa->xacts[k];
      }
      if (pa->rows_read[k] >= 0 && pb->rows_read[k] >= 0) {
        json_object_set_new(rr, pa->db[k], per(pb->rows_read[k] - pa->rows_read[k], orders));
        rr_total += pb->rows_read[k] - pa->rows_read[k];
      }
      if (pa->statements[k] >= 0 && pb->statements[k] >= 0) {
        json_object_set_new(st, pa->db[k], per(pb->statements[k] - pa->statements[k], orders));
        st_total += pb->statements[k] - pa->statements[k];
      } else {
        st_known = false;
      }
    }
    json_object_set_new(tx, "total", per(tx_total, orders));
    json_object_set_new(j, "pg_transactions", tx);
    json_object_set_new(rr, "total", per(rr_total, orders));
    json_object_set_new(j, "pg_rows_read", rr);
    if (st_known) {
      json_object_set_new(st, "total", per(st_total, orders));
      json_object_set_new(j, "pg_statements", st);
    } else {
      json_decref(st);
    }
  }
  if (a->redis_commands >= 0 && b->redis_commands >= 0)
    json_object_set_new(j, "redis_commands", per(b->redis_commands - a->redis_commands, orders));
  if (a->tc_frames_in >= 0 && b->tc_frames_in >= 0)
    json_object_set_new(j, "tc_frames", per(b->tc_frames_in - a->tc_frames_in, orders));
  if (a->stock_http >= 0 && b->stock_http >= 0)
    json_object_set_new(j, "stock_http_requests", per(b->stock_http - a->stock_http, orders));
  return j;
}
