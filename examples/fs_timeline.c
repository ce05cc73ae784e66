/*
 * fs_timeline.c - the flash sale over time (fs_timeline.h).
 */
#include "fs_timeline.h"

#include "svc_common.h"
#include "txc_worker.h"

#include <libpq-fe.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STOCK_SAMPLES 30000 /* 100 minutes at 200 ms */

typedef struct {
  int64_t due_us, start_us, end_us;
  unsigned char kind, accepted;
} req_t;

typedef struct {
  long long bucket, stock, frozen, sold;
} bucket_t;

typedef struct {
  int64_t t_us;
  int nb; /* buckets read, at most FS_TIMELINE_MAX_BUCKETS kept in b[] */
  bucket_t b[FS_TIMELINE_MAX_BUCKETS];
  long long stock, frozen, sold; /* over every bucket */
} stock_sample_t;

struct fs_timeline {
  req_t *req;
  size_t nreq, capreq, dropped;

  pthread_mutex_t mu; /* the stock samples */
  txc_worker_t job; /* a stock sample every FS_TIMELINE_STOCK_MS */
  bool started;
  PGconn *pg;
  long long activity;
  int64_t (*clock_us)(void);
  stock_sample_t *stock;
  size_t nstock, capstock;
};

fs_timeline_t *fs_timeline_new(void) {
  fs_timeline_t *t = calloc(1, sizeof(*t));
  if (!t) return NULL;
  pthread_mutex_init(&t->mu, NULL);
  return t;
}

void fs_timeline_free(fs_timeline_t *t) {
  if (!t) return;
  fs_timeline_stop_stock(t);
  pthread_mutex_destroy(&t->mu);
  free(t->req);
  free(t->stock);
  free(t);
}

void fs_timeline_request(fs_timeline_t *t, fs_req_kind_t kind, int64_t due_us, int64_t start_us, int64_t end_us,
                         bool accepted) {
  if (!t) return;
  if (t->nreq == t->capreq) {
    size_t cap = t->capreq ? t->capreq * 2 : 4096;
    if (cap > FS_TIMELINE_MAX_REQUESTS) cap = FS_TIMELINE_MAX_REQUESTS;
    req_t *v = cap > t->capreq ? realloc(t->req, cap * sizeof(*v)) : NULL;
    if (!v) {
      t->dropped++;
      return;
    }
    t->req = v;
    t->capreq = cap;
  }
  t->req[t->nreq++] = (req_t){.due_us = due_us, .start_us = start_us, .end_us = end_us,
                              .kind = (unsigned char)kind, .accepted = accepted};
}

/* ---------------------------------------------------------------- stock */

static const char STOCK_SQL[] = "SELECT bucket_id, stock, frozen_count, sold_count FROM activity_ticket_bucket"
                                " WHERE activity_id = $1::bigint ORDER BY ticket_type, bucket_id";

static void sample_stock(fs_timeline_t *t) {
  char id[24];
  snprintf(id, sizeof(id), "%lld", t->activity);
  const char *params[] = {id};
  int64_t at = t->clock_us();
  PGresult *res = PQexecParams(t->pg, STOCK_SQL, 1, NULL, params, NULL, NULL, 0);
  if (PQresultStatus(res) == PGRES_TUPLES_OK) {
    stock_sample_t s = {.t_us = at};
    for (int i = 0; i < PQntuples(res); i++) {
      bucket_t b = {atoll(PQgetvalue(res, i, 0)), atoll(PQgetvalue(res, i, 1)), atoll(PQgetvalue(res, i, 2)),
                    atoll(PQgetvalue(res, i, 3))};
      if (s.nb < FS_TIMELINE_MAX_BUCKETS) s.b[s.nb++] = b;
      s.stock += b.stock;
      s.frozen += b.frozen;
      s.sold += b.sold;
    }
    pthread_mutex_lock(&t->mu);
    if (t->nstock == t->capstock && t->capstock < MAX_STOCK_SAMPLES) {
      size_t cap = t->capstock ? t->capstock * 2 : 256;
      if (cap > MAX_STOCK_SAMPLES) cap = MAX_STOCK_SAMPLES;
      stock_sample_t *v = realloc(t->stock, cap * sizeof(*v));
      if (v) {
        t->stock = v;
        t->capstock = cap;
      }
    }
    if (t->nstock < t->capstock) t->stock[t->nstock++] = s;
    pthread_mutex_unlock(&t->mu);
  } else if (PQstatus(t->pg) == CONNECTION_BAD) {
    PQreset(t->pg); /* the next sample tries again; a gap in the chart meanwhile */
  }
  PQclear(res);
}

static void *stock_thread(void *arg) {
  fs_timeline_t *t = arg;
  do {
    sample_stock(t);
  } while (txc_worker_beat(&t->job, FS_TIMELINE_STOCK_MS));
  return NULL;
}

bool fs_timeline_start_stock(fs_timeline_t *t, const char *conninfo, long long activity, int64_t (*clock_us)(void),
                             char *err, size_t errlen) {
  if (!t || t->started) {
    snprintf(err, errlen, "%s", t ? "already sampling" : "no timeline");
    return false;
  }
  /* read-only, and never waiting long: the sale's rows are hot */
  const char *keys[] = {"dbname", "options", "application_name", NULL};
  const char *vals[] = {conninfo, "-c default_transaction_read_only=on -c statement_timeout=1000 -c lock_timeout=200",
                        "flashsale-timeline", NULL};
  t->pg = PQconnectdbParams(keys, vals, 1);
  if (PQstatus(t->pg) != CONNECTION_OK) {
    snprintf(err, errlen, "stock database: %s", PQerrorMessage(t->pg));
    PQfinish(t->pg);
    t->pg = NULL;
    return false;
  }
  t->activity = activity;
  t->clock_us = clock_us;
  if (txc_worker_start(&t->job, stock_thread, t) != 0) {
    snprintf(err, errlen, "cannot start the stock sampling thread");
    PQfinish(t->pg);
    t->pg = NULL;
    return false;
  }
  t->started = true;
  return true;
}

void fs_timeline_stop_stock(fs_timeline_t *t) {
  if (!t || !t->started) return;
  txc_worker_stop(&t->job);
  t->started = false;
  PQfinish(t->pg);
  t->pg = NULL;
}

/* ----------------------------------------------------------------- JSON */

static int nice_slot_ms(int64_t span_ms) {
  static const int steps[] = {100, 200, 250, 500, 1000, 2000, 5000, 10000, 15000, 30000, 60000};
  for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++)
    if (span_ms / steps[i] < FS_TIMELINE_MAX_SLOTS) return steps[i];
  return (int)(span_ms / FS_TIMELINE_MAX_SLOTS + 1);
}

static json_t *num(double v) { return isnan(v) ? json_null() : json_real(round(v * 100) / 100); }

json_t *fs_timeline_json(fs_timeline_t *t, int slot_ms) {
  json_t *out = json_object();
  if (!t || !out) return out;
  /* the stock samples are copied under the lock: the thread may still run */
  pthread_mutex_lock(&t->mu);
  size_t nstock = t->nstock;
  stock_sample_t *stock = nstock ? malloc(nstock * sizeof(*stock)) : NULL;
  if (stock) memcpy(stock, t->stock, nstock * sizeof(*stock));
  else nstock = 0;
  pthread_mutex_unlock(&t->mu);

  int64_t t0 = INT64_MAX, t1 = INT64_MIN;
  for (size_t i = 0; i < t->nreq; i++) {
    if (t->req[i].due_us < t0) t0 = t->req[i].due_us;
    if (t->req[i].end_us > t1) t1 = t->req[i].end_us;
  }
  if (t->nreq == 0) t0 = t1 = 0;
  if (slot_ms <= 0) slot_ms = nice_slot_ms((t1 - t0) / 1000);
  int64_t slot_us = (int64_t)slot_ms * 1000;
  size_t ns = t->nreq ? (size_t)((t1 - t0) / slot_us) + 1 : 0;
  if (ns > FS_TIMELINE_MAX_SLOTS) ns = FS_TIMELINE_MAX_SLOTS; /* only with a slot_ms given too small */
#define SLOT(us) ((size_t)(((us) - t0) / slot_us) < ns ? (size_t)(((us) - t0) / slot_us) : ns - 1)

  long long *due = calloc(ns + 1, sizeof(long long)), *answered = calloc(ns + 1, sizeof(long long)),
            *accepted = calloc(ns + 1, sizeof(long long)), *flight = calloc(ns + 1, sizeof(long long));
  size_t *off = calloc(ns + 2, sizeof(size_t));
  long long *lat = t->nreq ? malloc(t->nreq * sizeof(*lat)) : NULL; /* µs */
  if (!due || !answered || !accepted || !flight || !off || (t->nreq && !lat)) {
    json_decref(out);
    out = NULL;
    goto done;
  }
  for (size_t i = 0; i < t->nreq; i++) {
    const req_t *q = &t->req[i];
    size_t e = SLOT(q->end_us), s = SLOT(q->start_us > t0 ? q->start_us : t0);
    flight[s]++; /* in flight at the end of slot k: started by then, not yet answered */
    flight[e]--;
    if (q->kind != FS_REQ_PURCHASE) continue;
    due[SLOT(q->due_us)]++;
    answered[e]++;
    if (q->accepted) accepted[e]++;
    off[e + 1]++;
  }
  for (size_t k = 1; k <= ns; k++) off[k] += off[k - 1];
  for (size_t i = 0; i < t->nreq; i++) { /* latencies grouped by the slot they were answered in */
    const req_t *q = &t->req[i];
    if (q->kind == FS_REQ_PURCHASE) lat[off[SLOT(q->end_us)]++] = q->end_us - q->due_us;
  }
  for (size_t k = ns; k > 0; k--) off[k] = off[k - 1];
  off[0] = 0;

  json_t *tms = json_array(), *per_s = json_array(), *acc_s = json_array(), *p50 = json_array(),
         *p99 = json_array(), *inflight = json_array(), *avail = json_array(), *frozen = json_array(),
         *sold = json_array(), *buckets = json_array();
  int nbk = 0;
  for (size_t i = 0; i < nstock; i++)
    if (stock[i].nb > nbk) nbk = stock[i].nb;
  json_t *bavail[FS_TIMELINE_MAX_BUCKETS];
  for (int b = 0; b < nbk; b++) bavail[b] = json_array();
  double per_second = 1000.0 / slot_ms;
  long long in_air = 0;
  size_t si = 0; /* the last stock sample at or before the slot's end */
  bool have_sample = false;
  for (size_t k = 0; k < ns; k++) {
    json_array_append_new(tms, json_integer((json_int_t)k * slot_ms));
    json_array_append_new(per_s, num((double)due[k] * per_second));
    json_array_append_new(acc_s, num((double)accepted[k] * per_second));
    size_t n = off[k + 1] - off[k];
    svc_sort_ll(lat + off[k], n);
    json_array_append_new(p50, n ? num(svc_pct_ms(lat + off[k], n, 50)) : json_null());
    json_array_append_new(p99, n ? num(svc_pct_ms(lat + off[k], n, 99)) : json_null());
    in_air += flight[k];
    json_array_append_new(inflight, json_integer(in_air));
    int64_t end = t0 + (int64_t)(k + 1) * slot_us;
    while (si < nstock && stock[si].t_us <= end) {
      si++;
      have_sample = true;
    }
    const stock_sample_t *s = have_sample ? &stock[si - 1] : NULL;
    json_array_append_new(avail, s ? json_integer(s->stock - s->frozen - s->sold) : json_null());
    json_array_append_new(frozen, s ? json_integer(s->frozen) : json_null());
    json_array_append_new(sold, s ? json_integer(s->sold) : json_null());
    for (int b = 0; b < nbk; b++)
      json_array_append_new(bavail[b], s && b < s->nb ? json_integer(s->b[b].stock - s->b[b].frozen - s->b[b].sold)
                                                      : json_null());
  }
  for (int b = 0; b < nbk; b++) {
    long long id = b;
    for (size_t i = 0; i < nstock; i++)
      if (b < stock[i].nb) id = stock[i].b[b].bucket;
    json_array_append_new(buckets, json_pack("{s:I,s:o}", "bucket", (json_int_t)id, "available", bavail[b]));
  }
  json_object_set_new(out, "slot_ms", json_integer(slot_ms));
  json_object_set_new(out, "t_ms", tms);
  json_object_set_new(out, "purchases_per_s", per_s);
  json_object_set_new(out, "accepted_per_s", acc_s);
  json_object_set_new(out, "p50_ms", p50);
  json_object_set_new(out, "p99_ms", p99);
  json_object_set_new(out, "in_flight", inflight);
  json_object_set_new(out, "available", avail);
  json_object_set_new(out, "frozen", frozen);
  json_object_set_new(out, "sold", sold);
  json_object_set_new(out, "buckets", buckets);
  json_object_set_new(out, "stock_samples", json_integer((json_int_t)nstock));
  json_object_set_new(out, "dropped", json_integer((json_int_t)t->dropped));
#undef SLOT
done:
  free(due);
  free(answered);
  free(accepted);
  free(flight);
  free(off);
  free(lat);
  free(stock);
  return out;
}
