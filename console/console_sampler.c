/*
 * console_sampler.c - once a second, the stock and the order-service's
 * counters (console_sampler.h).
 */
#include "console_sampler.h"

#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "console_prom.h"
#include "txc_buf.h"
#include "txc_isotime.h"
#include "txc_worker.h"

#define MAX_BOUNDS CONSOLE_PROM_BOUNDS
#define ORDER_SERIES "txc_http_request_duration_seconds"

typedef struct {
  int64_t id, stock, frozen, sold;
} act_sample_t;

typedef struct {
  int64_t unix_ms;
  bool have_http;
  double requests_per_s, accepted_per_s, p50_ms, p99_ms; /* p*: -1 = no answer that second */
  int nact;
  act_sample_t act[CONSOLE_ACTIVITIES];
} sample_t;

/* One service's counters as last read (cumulative). */
typedef struct {
  char *url;
  bool seen;
  int nb;
  double le[MAX_BOUNDS], cum[MAX_BOUNDS];
  double total, accepted;
} scrape_t;

struct console_sampler {
  console_db_t *stock;
  scrape_t scrape[CONSOLE_METRICS_URLS];
  int nscrape;
  CURL *curl;
  txc_worker_t job; /* a sample every CONSOLE_SAMPLE_MS */
  bool started;
  pthread_mutex_t mu; /* ring, last_error */
  sample_t ring[CONSOLE_SAMPLES];
  int head, count; /* ring[head] is the next slot */
  char last_error[256];
};

/* ------------------------------------------------------------ /metrics */

/* Read one service; on success its deltas since the last read are added
 * to d_le/d_cum (same bounds assumed: the services share svc_http.c). */
static bool scrape_one(console_sampler_t *s, scrape_t *sc, double *d_cum, double *d_le, int *d_nb, double *d_total,
                       double *d_accepted) {
  txc_buf_t b = {.max = CONSOLE_METRICS_MAX};
  curl_easy_setopt(s->curl, CURLOPT_URL, sc->url);
  curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, txc_buf_curl_write);
  curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, &b);
  CURLcode rc = curl_easy_perform(s->curl);
  long code = 0;
  curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &code);
  if (rc != CURLE_OK || code != 200 || !b.p) {
    pthread_mutex_lock(&s->mu);
    snprintf(s->last_error, sizeof(s->last_error), "%s: %s", sc->url,
             b.over ? "answer too large" : rc != CURLE_OK ? curl_easy_strerror(rc) : "not 200");
    pthread_mutex_unlock(&s->mu);
    free(b.p);
    return false;
  }
  console_prom_t got;
  console_prom_parse(b.p, b.len, ORDER_SERIES, "POST", "/orders", &got);
  free(b.p);
  scrape_t now = {.url = sc->url, .nb = got.nb, .total = got.total, .accepted = got.accepted};
  memcpy(now.le, got.le, sizeof(now.le));
  memcpy(now.cum, got.cum, sizeof(now.cum));
  if (sc->seen) {
    bool reset = now.total < sc->total;
    for (int k = 0; k < now.nb; k++) {
      double before = 0;
      for (int j = 0; !reset && j < sc->nb; j++)
        if (sc->le[j] == now.le[k]) before = sc->cum[j];
      int j = 0;
      while (j < *d_nb && d_le[j] != now.le[k]) j++;
      if (j == *d_nb) {
        if (*d_nb == MAX_BOUNDS) continue;
        d_le[j] = now.le[k];
        d_cum[j] = 0;
        (*d_nb)++;
      }
      d_cum[j] += now.cum[k] - before > 0 ? now.cum[k] - before : 0;
    }
    *d_total += reset ? now.total : now.total - sc->total;
    *d_accepted += reset || now.accepted < sc->accepted ? now.accepted : now.accepted - sc->accepted;
  }
  now.seen = true;
  *sc = now;
  return true;
}

static void sort_bounds(double *le, double *cum, int n) {
  for (int i = 1; i < n; i++)
    for (int k = i; k > 0 && le[k - 1] > le[k]; k--) {
      double t = le[k];
      le[k] = le[k - 1];
      le[k - 1] = t;
      t = cum[k];
      cum[k] = cum[k - 1];
      cum[k - 1] = t;
    }
}

/* --------------------------------------------------------------- stock */

static const char STOCK_SQL[] =
    "SELECT coalesce(json_agg(json_build_array(activity_id, s, f, so) ORDER BY activity_id), '[]')::text"
    "  FROM (SELECT activity_id, sum(stock) s, sum(frozen_count) f, sum(sold_count) so"
    "          FROM activity_ticket_bucket GROUP BY activity_id ORDER BY activity_id DESC LIMIT $1::int) a";

static void sample_stock(console_sampler_t *s, sample_t *out) {
  char limit[8], err[256];
  snprintf(limit, sizeof(limit), "%d", CONSOLE_ACTIVITIES);
  const char *params[] = {limit};
  char *text = NULL;
  if (console_db_value(s->stock, STOCK_SQL, 1, params, &text, err, sizeof(err)) != 0) {
    pthread_mutex_lock(&s->mu);
    snprintf(s->last_error, sizeof(s->last_error), "%s", err);
    pthread_mutex_unlock(&s->mu);
    return;
  }
  json_t *rows = json_loads(text, 0, NULL);
  free(text);
  size_t i;
  json_t *row;
  json_array_foreach(rows, i, row) {
    if (out->nact == CONSOLE_ACTIVITIES) break;
    act_sample_t *a = &out->act[out->nact++];
    a->id = json_integer_value(json_array_get(row, 0));
    a->stock = json_integer_value(json_array_get(row, 1));
    a->frozen = json_integer_value(json_array_get(row, 2));
    a->sold = json_integer_value(json_array_get(row, 3));
  }
  json_decref(rows);
}

/* -------------------------------------------------------------- thread */

static void take_sample(console_sampler_t *s) {
  sample_t smp = {.unix_ms = txc_unix_ms(), .p50_ms = -1, .p99_ms = -1};
  pthread_mutex_lock(&s->mu);
  s->last_error[0] = '\0'; /* what this sample meets, if anything */
  pthread_mutex_unlock(&s->mu);
  if (s->stock) sample_stock(s, &smp);
  double le[MAX_BOUNDS], cum[MAX_BOUNDS], total = 0, accepted = 0;
  int nb = 0, ok = 0, first = 0;
  for (int i = 0; i < s->nscrape; i++) {
    bool was_seen = s->scrape[i].seen;
    if (scrape_one(s, &s->scrape[i], cum, le, &nb, &total, &accepted)) {
      ok++;
      if (!was_seen) first++;
    }
  }
  if (ok > first) { /* at least one service read twice: its deltas are a second's */
    double secs = CONSOLE_SAMPLE_MS / 1000.0;
    smp.have_http = true;
    smp.requests_per_s = total / secs;
    smp.accepted_per_s = accepted / secs;
    sort_bounds(le, cum, nb);
    double p50 = console_histogram_quantile(le, cum, nb, 0.5), p99 = console_histogram_quantile(le, cum, nb, 0.99);
    smp.p50_ms = p50 < 0 ? -1 : p50 * 1000;
    smp.p99_ms = p99 < 0 ? -1 : p99 * 1000;
  }
  pthread_mutex_lock(&s->mu);
  s->ring[s->head] = smp;
  s->head = (s->head + 1) % CONSOLE_SAMPLES;
  if (s->count < CONSOLE_SAMPLES) s->count++;
  pthread_mutex_unlock(&s->mu);
}

static void *run(void *arg) {
  console_sampler_t *s = arg;
  do {
    take_sample(s);
  } while (txc_worker_beat(&s->job, CONSOLE_SAMPLE_MS));
  return NULL;
}

console_sampler_t *console_sampler_start(console_db_t *stock, const char *metrics_urls, char *err, size_t errlen) {
  console_sampler_t *s = calloc(1, sizeof(*s));
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  s->stock = stock;
  pthread_mutex_init(&s->mu, NULL);
  const char *p = metrics_urls ? metrics_urls : "";
  while (*p) {
    const char *e = strchr(p, ',');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n > 0) {
      if (s->nscrape == CONSOLE_METRICS_URLS) {
        snprintf(err, errlen, "more than %d metrics URLs", CONSOLE_METRICS_URLS);
        console_sampler_stop(s);
        return NULL;
      }
      if (strncmp(p, "http://", 7) != 0 && strncmp(p, "https://", 8) != 0) {
        snprintf(err, errlen, "metrics URL '%.*s': not http:// or https://", (int)(n > 200 ? 200 : n), p);
        console_sampler_stop(s);
        return NULL;
      }
      s->scrape[s->nscrape++].url = strndup(p, n);
    }
    p += n + (e ? 1 : 0);
  }
  if (s->nscrape > 0) {
    s->curl = curl_easy_init();
    if (!s->curl) {
      snprintf(err, errlen, "curl_easy_init failed");
      console_sampler_stop(s);
      return NULL;
    }
    curl_easy_setopt(s->curl, CURLOPT_TIMEOUT_MS, 800L);
    curl_easy_setopt(s->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->curl, CURLOPT_PROTOCOLS_STR, "http,https");
  }
  if (txc_worker_start(&s->job, run, s) != 0) {
    snprintf(err, errlen, "cannot start the sampler thread");
    console_sampler_stop(s);
    return NULL;
  }
  s->started = true;
  return s;
}

void console_sampler_stop(console_sampler_t *s) {
  if (!s) return;
  if (s->started) txc_worker_stop(&s->job);
  if (s->curl) curl_easy_cleanup(s->curl);
  for (int i = 0; i < s->nscrape; i++) free(s->scrape[i].url);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static json_t *num_or_null(bool have, double v) { return have ? json_real(round(v * 10) / 10) : json_null(); }

json_t *console_sampler_json(console_sampler_t *s, int64_t activity, int seconds) {
  json_t *t = json_array(), *req = json_array(), *acc = json_array(), *p50 = json_array(), *p99 = json_array(),
         *avail = json_array(), *frozen = json_array(), *sold = json_array();
  pthread_mutex_lock(&s->mu);
  int n = seconds < s->count ? seconds : s->count;
  if (n < 0) n = 0;
  for (int i = n; i >= 1; i--) {
    const sample_t *m = &s->ring[(s->head - i + CONSOLE_SAMPLES) % CONSOLE_SAMPLES];
    json_array_append_new(t, json_integer(m->unix_ms));
    json_array_append_new(req, num_or_null(m->have_http, m->requests_per_s));
    json_array_append_new(acc, num_or_null(m->have_http, m->accepted_per_s));
    json_array_append_new(p50, num_or_null(m->have_http && m->p50_ms >= 0, m->p50_ms));
    json_array_append_new(p99, num_or_null(m->have_http && m->p99_ms >= 0, m->p99_ms));
    const act_sample_t *a = NULL;
    for (int k = 0; k < m->nact && activity > 0; k++)
      if (m->act[k].id == activity) a = &m->act[k];
    json_array_append_new(avail, a ? json_integer(a->stock - a->frozen - a->sold) : json_null());
    json_array_append_new(frozen, a ? json_integer(a->frozen) : json_null());
    json_array_append_new(sold, a ? json_integer(a->sold) : json_null());
  }
  json_t *out = json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:s?}", "interval_ms", CONSOLE_SAMPLE_MS, "t", t,
                          "requests_per_s", req, "accepted_per_s", acc, "p50_ms", p50, "p99_ms", p99, "available",
                          avail, "frozen", frozen, "sold", sold, "last_error",
                          s->last_error[0] ? s->last_error : NULL);
  pthread_mutex_unlock(&s->mu);
  return out;
}
