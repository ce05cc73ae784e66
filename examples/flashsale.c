/*
 * flashsale.c - the flash-sale load generator and checker (build/bin/flashsale).
 *
 * NOTES
 *   Replays a flash sale against order-service and then checks, directly
 *   on PostgreSQL and Redis, that nothing was oversold, that every ticket
 *   is accounted for, that no lock or undo row outlived its transaction
 *   and that Redis agrees with PostgreSQL.
 *
 *   1. Seed: a new activity (or --activity ID, which must not exist yet)
 *      with --tickets tickets split over --buckets bucket rows of ticket
 *      type 1 and per-user limit --limit, on sale from now; then loaded
 *      into Redis by the prefilter's seed (rm_prefilter_seed).  With
 *      --open-in MS the sale has a window instead: not started, opening
 *      in MS milliseconds and closing --close-after MS after that
 *      (default: the arrival window plus --think-ms plus 3 s);
 *      stock-service's window job opens and closes it.  Then one order
 *      before the opening must be refused not_on_sale, the sale starts
 *      once PostgreSQL and Redis both say status 1 (how late after
 *      starts_at is printed), and after the sale, once both say status 2
 *      (how late after ends_at), one more order must be refused
 *      not_on_sale: the "sale_window" of the report, which fails the run
 *      (exit 1) when any of it does not hold.
 *   2. Sale: --users users arrive at random instants within --window
 *      seconds; each sends POST /orders with 1..limit tickets.  After a
 *      201, a user buys again with --again percent probability (which can
 *      meet the per-user limit), and later pays (--pay percent) or cancels
 *      (--cancel percent) after a random pause of up to --think-ms; the
 *      rest stay unpaid (frozen) until the service's expiry job, if any.
 *      Every purchase carries an Idempotency-Key of its own
 *      ("fs<activity>-<user>-<n>", n = 0 for the first purchase, 1 for the
 *      repeat); a transport error, a 503 or a 409 in_progress is retried
 *      with the same key, up to twice (100 ms, then 400 ms later; 1 s for
 *      in_progress), and --dup percent of the answered purchases are sent
 *      once more with their key, as a client that lost the answer would:
 *      each must get the same answer (one_order_per_key checks the 201s).
 *      One thread drives it all through a libcurl multi handle: the loop
 *      waits in curl_multi_poll until a socket is ready, the next arrival
 *      is due or the progress line is due.  At most --connections
 *      requests are on the wire at once (libcurl queues the rest), and a
 *      request's latency runs from its scheduled instant, so queueing in
 *      the generator counts against the system, not for it.
 *   3. Settle: wait (up to --settle seconds) until the coordinator has
 *      finished every global transaction of the run and the undo logs are
 *      empty.
 *   4. Report: counts, latency percentiles, global transactions from the
 *      TC database (and per accepted order: 1.0, since only the purchase
 *      is a global transaction), the order events over the run (published:
 *      order-service's txc_events_published_total; consumed, retried and
 *      dead-lettered by group, and the local transactions that applied
 *      them ("commits": consumed / commits is the events per commit):
 *      stock-service's and event-consumers' /metrics, as the difference
 *      between a scrape before and one after),
 *      the invariants; --json FILE writes the same figures.
 *      Exit status 0 when every invariant holds, 1 when one fails, 2 on a
 *      usage error, 3 when the run could not be done.
 *
 *   Environment (cluster/local/up prints it): ORDER_URL, STOCK_PG_URL,
 *   ORDERS_PG_URL, TC_PG_URL, REDIS_URL; optional: EVENTS_PG_URL (the
 *   consumers_once invariant), STOCK_URL and EVENTS_URL (examples/services
 *   prints them: the consumer groups' counters in the report).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "fs_check.h"
#include "fs_report.h"
#include "fs_timeline.h"
#include "svc_common.h"
#include "svc_http.h"
#include "svc_prefilter.h"
#include "txc_isotime.h"

#define TICKET_TYPE 1

typedef struct opts {
  long long users, tickets, buckets, limit, activity;
  double window_s;
  int pay_pct, cancel_pct, again_pct, dup_pct;
  bool no_keys; /* --no-keys: purchases without an Idempotency-Key, never retried */
  int think_ms;
  int connections;
  int settle_s;
  unsigned seed;
  const char *json_path;
  const char *html_path; /* --html: the report as a page with charts (fs_report.h) */
  bool quiet;
  bool check_only;
  long long open_in_ms, close_after_ms; /* --open-in, --close-after: the sale window */
} opts_t;

typedef enum { REQ_ORDER, REQ_PAY, REQ_CANCEL } req_kind_t;

#define MAX_RETRIES 2
#define QUEUED_TRIES 100 /* pay/cancel of a queued order not made yet: 200 ms apart, 20 s in all */

/* A scheduled request. */
typedef struct job {
  int64_t at_us;    /* when it is due (relative to the sale start) */
  int64_t first_us; /* a retry: when its first try was due (latency counts from there) */
  req_kind_t kind;
  int user;         /* index into users */
  long long order_id;
  int qty;
  bool again;       /* a second purchase */
  int tries;        /* tries before this one (same Idempotency-Key) */
  bool dup;         /* the purchase sent again after its answer: must get the same */
  int want_status;  /* dup: the first answer's status, order id and refusal */
  long long want_order;
  char want_reason[16];
  char token[72];   /* pay/cancel: the order_token of the 201 ("" without one) */
} job_t;

/* Min-heap of jobs by at_us. */
typedef struct heap {
  job_t *v;
  size_t n, cap;
} heap_t;

/* An answer longer than this stops its transfer (an error). */
#define XFER_MAX_ANSWER (1u << 20)

typedef struct xfer {
  CURL *e;
  job_t job;
  int64_t sched_us;
  int64_t started_us; /* on the wire (relative to the sale start) */
  txc_buf_t resp; /* the answer (at most XFER_MAX_ANSWER bytes) */
  char body[256];
  struct curl_slist *hdrs; /* the run's headers and this request's Idempotency-Key */
  struct xfer *next_free;
} xfer_t;

typedef struct run {
  opts_t o;
  const char *order_url;
  CURLM *multi;
  struct curl_slist *hdrs;
  heap_t heap;
  xfer_t *free_x;
  int64_t t0_us;
  int inflight;
  unsigned rng;

  /* results */
  long long sent, done, ok, ok_tickets, again_sent;
  long long queued; /* of the ok: answered 202 (ORDER_MODE=queued) */
  long long *queued_ids; /* their orders, and when each was clicked (unix ms) */
  int64_t *queued_ms;
  size_t nqueued, capqueued;
  int64_t t0_wall_ms;
  long long rej_not_on_sale, rej_over_limit, rej_sold_out, rej_other;
  long long unavailable, unknown, transport, http_other;
  long long paid, pay_fail, cancelled, cancel_fail;
  long long retried;                     /* purchases tried again with their key */
  long long dup_sent, dup_same, dup_differ; /* --dup: sent again after the answer */
  long long *lat_us; /* POST /orders latencies */
  size_t nlat, caplat;
  long long *accepted; /* order ids answered 201 */
  size_t nacc, capacc;
  long long *paid_ids;
  size_t npaid, cappaid;
  fs_keyed_t *keyed; /* every 201 with its Idempotency-Key */
  size_t nkeyed, capkeyed;
  int64_t first_us, last_us;
  int64_t last_progress_us;
  fs_timeline_t *timeline; /* every finished request, for the report's charts (NULL: none) */
} run_t;

/* ----------------------------------------------------------------- rng */

static unsigned rnd(run_t *r) {
  /* xorshift32: reproducible with --seed */
  unsigned x = r->rng;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return r->rng = x;
}

static double rnd01(run_t *r) { return (double)rnd(r) / 4294967296.0; }

/* ---------------------------------------------------------------- heap */

/* 'v' (holding 'n' elements of 'size' bytes, room for '*cap') with room
 * for one more: itself, or grown to twice the room (1024 at first).
 * NULL: out of memory, 'v' and '*cap' unchanged. */
static void *with_room(void *v, size_t n, size_t *cap, size_t size) {
  if (n < *cap) return v;
  size_t c = *cap ? *cap * 2 : 1024;
  void *nv = realloc(v, c * size);
  if (nv) *cap = c;
  return nv;
}

static bool heap_push(heap_t *h, job_t j) {
  job_t *v = with_room(h->v, h->n, &h->cap, sizeof(*v));
  if (!v) return false;
  h->v = v;
  size_t i = h->n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h->v[p].at_us <= j.at_us) break;
    h->v[i] = h->v[p];
    i = p;
  }
  h->v[i] = j;
  return true;
}

static job_t heap_pop(heap_t *h) {
  job_t top = h->v[0];
  job_t last = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && h->v[c + 1].at_us < h->v[c].at_us) c++;
    if (last.at_us <= h->v[c].at_us) break;
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n) h->v[i] = last;
  return top;
}

static bool push_ll(long long **v, size_t *n, size_t *cap, long long x) {
  long long *nv = with_room(*v, *n, cap, sizeof(*nv));
  if (!nv) return false;
  *v = nv;
  (*v)[(*n)++] = x;
  return true;
}

static bool push_keyed(run_t *r, const char *key, long long user, long long order_id) {
  fs_keyed_t *v = with_room(r->keyed, r->nkeyed, &r->capkeyed, sizeof(*v));
  if (!v) return false;
  r->keyed = v;
  fs_keyed_t *k = &r->keyed[r->nkeyed++];
  size_t len = strnlen(key, sizeof(k->key) - 1); /* the keys job_key makes fit */
  memcpy(k->key, key, len);
  k->key[len] = '\0';
  k->user = user;
  k->order_id = order_id;
  return true;
}

/* The Idempotency-Key of a purchase: one per user and purchase. */
static void job_key(const run_t *r, const job_t *j, char *out, size_t len) {
  snprintf(out, len, "fs%lld-%d-%d", r->o.activity, j->user + 1, j->again ? 1 : 0);
}

/* ----------------------------------------------------------- transfers */

static int64_t now_rel(run_t *r) { return svc_now_us() - r->t0_us; }

static bool start_job(run_t *r, const job_t *j) {
  xfer_t *x = r->free_x;
  if (x) {
    r->free_x = x->next_free;
  } else {
    x = calloc(1, sizeof(*x));
    if (!x) return false;
    x->resp.max = XFER_MAX_ANSWER;
    x->e = curl_easy_init();
    if (!x->e) {
      free(x);
      return false;
    }
  }
  x->job = *j;
  x->sched_us = j->tries ? j->first_us : j->at_us;
  x->started_us = now_rel(r);
  txc_buf_clear(&x->resp);
  curl_slist_free_all(x->hdrs);
  x->hdrs = NULL;
  char url[512];
  if (j->kind == REQ_ORDER) {
    char key[80], h[128];
    job_key(r, j, key, sizeof(key));
    snprintf(h, sizeof(h), "Idempotency-Key: %s", key);
    for (const struct curl_slist *l = r->hdrs; l; l = l->next) x->hdrs = curl_slist_append(x->hdrs, l->data);
    if (!r->o.no_keys) x->hdrs = curl_slist_append(x->hdrs, h);
    if (!x->hdrs) return false;
    snprintf(url, sizeof(url), "%s/orders", r->order_url);
    snprintf(x->body, sizeof(x->body), "{\"activity\":%lld,\"ticket_type\":%d,\"user\":%d,\"qty\":%d}",
             r->o.activity, TICKET_TYPE, j->user + 1, j->qty);
  } else {
    char h[96];
    snprintf(h, sizeof(h), "Authorization: Bearer %s", j->token);
    for (const struct curl_slist *l = r->hdrs; l; l = l->next) x->hdrs = curl_slist_append(x->hdrs, l->data);
    if (j->token[0]) x->hdrs = curl_slist_append(x->hdrs, h);
    snprintf(url, sizeof(url), "%s/orders/%lld/%s", r->order_url, j->order_id,
             j->kind == REQ_PAY ? "pay" : "cancel");
    snprintf(x->body, sizeof(x->body), "{}");
  }
  curl_easy_reset(x->e);
  curl_easy_setopt(x->e, CURLOPT_URL, url);
  curl_easy_setopt(x->e, CURLOPT_POSTFIELDS, x->body);
  curl_easy_setopt(x->e, CURLOPT_HTTPHEADER, x->hdrs ? x->hdrs : r->hdrs);
  curl_easy_setopt(x->e, CURLOPT_WRITEFUNCTION, txc_buf_curl_write);
  curl_easy_setopt(x->e, CURLOPT_WRITEDATA, &x->resp);
  curl_easy_setopt(x->e, CURLOPT_PRIVATE, x);
  curl_easy_setopt(x->e, CURLOPT_TIMEOUT_MS, 60000L);
  curl_easy_setopt(x->e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(x->e, CURLOPT_TCP_NODELAY, 1L);
  if (curl_multi_add_handle(r->multi, x->e) != CURLM_OK) return false;
  r->inflight++;
  if (j->kind == REQ_ORDER && j->dup && !j->tries) r->dup_sent++;
  if (j->kind == REQ_ORDER && !j->dup && !j->tries) {
    r->sent++;
    if (j->again) r->again_sent++;
  }
  if (!r->first_us) r->first_us = now_rel(r);
  return true;
}

static const char *json_reason(const char *body, const char *key, char *buf, size_t len) {
  json_t *o = body ? json_loads(body, 0, NULL) : NULL;
  const char *s = json_string_value(json_object_get(o, key));
  snprintf(buf, len, "%s", s ? s : "");
  json_decref(o);
  return buf;
}

/* --dup: maybe send the answered purchase 'j' once more, with its key. */
static void maybe_dup(run_t *r, const job_t *j, int64_t now, long status, long long order_id, const char *reason) {
  if (r->o.dup_pct == 0 || r->o.no_keys || j->dup || (int)(rnd(r) % 100) >= r->o.dup_pct) return;
  job_t d = *j;
  d.dup = true;
  d.tries = 0;
  d.at_us = now + (int64_t)(rnd01(r) * 100000);
  d.want_status = (int)status;
  d.want_order = order_id;
  snprintf(d.want_reason, sizeof(d.want_reason), "%s", reason);
  heap_push(&r->heap, d);
}

/* The answer to a --dup request: the first answer again? */
static void finish_dup(run_t *r, const xfer_t *x, CURLcode cc, long status) {
  const job_t *j = &x->job;
  char why[64] = "", key[80];
  long long id = 0;
  if (cc != CURLE_OK) return; /* no answer: neither same nor differing */
  if (status == 201 || status == 202) {
    json_t *o = json_loads(x->resp.p ? x->resp.p : "", 0, NULL);
    id = (long long)json_integer_value(json_object_get(o, "order_id"));
    json_decref(o);
    job_key(r, j, key, sizeof(key));
    if (id > 0 && !r->o.no_keys) push_keyed(r, key, j->user + 1, id);
  } else if (status == 409) {
    json_reason(x->resp.p, "reason", why, sizeof(why));
  }
  bool same = status == j->want_status && ((status != 201 && status != 202) || id == j->want_order) &&
              (status != 409 || strcmp(why, j->want_reason) == 0);
  if (same)
    r->dup_same++;
  else
    r->dup_differ++;
}

/* Handle one finished transfer. */
static void finish_xfer(run_t *r, xfer_t *x, CURLcode cc) {
  int64_t now = now_rel(r);
  r->last_us = now;
  r->inflight--;
  long status = 0;
  if (cc == CURLE_OK) curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &status);
  const job_t *j = &x->job;
  /* the timeline's kind: the final answer of a purchase, a payment or a
   * cancellation; a try that is retried and a --dup resend only count in
   * flight */
  fs_req_kind_t drawn = j->kind == REQ_PAY ? FS_REQ_PAY : j->kind == REQ_CANCEL ? FS_REQ_CANCEL : FS_REQ_OTHER;
  char why[64] = "";
  if (j->kind == REQ_ORDER && cc == CURLE_OK && status == 409) json_reason(x->resp.p, "error", why, sizeof(why));
  bool in_progress = strcmp(why, "in_progress") == 0;
  if (j->kind == REQ_ORDER && !r->o.no_keys && (cc != CURLE_OK || status == 503 || in_progress) &&
      j->tries < MAX_RETRIES) {
    /* The same purchase again, with the same key: whatever the first try
     * did, it cannot make a second order. */
    job_t t = *j;
    t.first_us = x->sched_us;
    t.tries++;
    t.at_us = now + (in_progress ? 1000000 : j->tries == 0 ? 100000 : 400000);
    heap_push(&r->heap, t);
    r->retried++;
  } else if (j->kind == REQ_ORDER && j->dup) {
    finish_dup(r, x, cc, status);
  } else if (j->kind == REQ_ORDER) {
    drawn = FS_REQ_PURCHASE;
    r->done++;
    push_ll(&r->lat_us, &r->nlat, &r->caplat, now - x->sched_us);
    if (cc != CURLE_OK) {
      r->transport++;
    } else if (status == 201 || status == 202) {
      /* 202: the queued order mode (ORDER_MODE=queued), the order is made
       * a moment later; pay and cancel wait for it (below) */
      r->ok++;
      if (status == 202) r->queued++;
      if (status == 202 && r->nqueued < (size_t)r->queued) {
        json_t *qo = json_loads(x->resp.p ? x->resp.p : "", 0, NULL);
        long long qid = (long long)json_integer_value(json_object_get(qo, "order_id"));
        json_decref(qo);
        int64_t clicked = r->t0_wall_ms + x->sched_us / 1000;
        if (qid > 0 && push_ll(&r->queued_ids, &r->nqueued, &r->capqueued, qid)) {
          size_t cap = r->capqueued;
          int64_t *ms = realloc(r->queued_ms, cap * sizeof(int64_t));
          if (ms) {
            r->queued_ms = ms;
            r->queued_ms[r->nqueued - 1] = clicked;
          } else {
            r->nqueued--;
          }
        }
      }
      r->ok_tickets += j->qty;
      json_t *o = json_loads(x->resp.p ? x->resp.p : "", 0, NULL);
      long long id = (long long)json_integer_value(json_object_get(o, "order_id"));
      const char *tok = json_string_value(json_object_get(o, "order_token"));
      char token[sizeof(j->token)] = "";
      if (tok && strlen(tok) < sizeof(token)) snprintf(token, sizeof(token), "%s", tok);
      json_decref(o);
      if (id > 0) {
        char key[80];
        job_key(r, j, key, sizeof(key));
        if (!r->o.no_keys) push_keyed(r, key, j->user + 1, id);
        maybe_dup(r, j, now, status, id, "");
        push_ll(&r->accepted, &r->nacc, &r->capacc, id);
        /* what this user does next */
        if (!j->again && (int)(rnd(r) % 100) < r->o.again_pct) {
          job_t a = {.at_us = now + (int64_t)(rnd01(r) * 200000), .kind = REQ_ORDER, .user = j->user,
                     .qty = j->qty, .again = true};
          heap_push(&r->heap, a);
        }
        int dice = (int)(rnd(r) % 100);
        if (dice < r->o.pay_pct + r->o.cancel_pct) {
          job_t p = {.at_us = now + (int64_t)(rnd01(r) * r->o.think_ms * 1000.0),
                     .kind = dice < r->o.pay_pct ? REQ_PAY : REQ_CANCEL, .user = j->user, .order_id = id,
                     .qty = j->qty};
          memcpy(p.token, token, sizeof(p.token));
          heap_push(&r->heap, p);
        }
      }
    } else if (status == 409) {
      json_reason(x->resp.p, "reason", why, sizeof(why));
      if (!in_progress) maybe_dup(r, j, now, status, 0, why);
      if (strcmp(why, "not_on_sale") == 0)
        r->rej_not_on_sale++;
      else if (strcmp(why, "over_limit") == 0)
        r->rej_over_limit++;
      else if (strcmp(why, "sold_out") == 0)
        r->rej_sold_out++;
      else
        r->rej_other++;
    } else if (status == 503) {
      json_reason(x->resp.p, "error", why, sizeof(why));
      if (strcmp(why, "unknown_outcome") == 0)
        r->unknown++;
      else
        r->unavailable++;
    } else {
      r->http_other++;
    }
  } else if ((j->kind == REQ_PAY || j->kind == REQ_CANCEL) && cc == CURLE_OK && status == 404 && r->queued &&
             j->tries < QUEUED_TRIES) {
    /* a queued order not made yet: again in a moment */
    job_t t = *j;
    t.tries++;
    t.at_us = now + 200000;
    heap_push(&r->heap, t);
  } else if (j->kind == REQ_PAY) {
    if (cc == CURLE_OK && status == 200) {
      r->paid++;
      push_ll(&r->paid_ids, &r->npaid, &r->cappaid, j->order_id);
    } else {
      r->pay_fail++;
    }
  } else {
    if (cc == CURLE_OK && status == 200)
      r->cancelled++;
    else
      r->cancel_fail++;
  }
  fs_timeline_request(r->timeline, drawn, r->t0_us + x->sched_us, r->t0_us + x->started_us, r->t0_us + now,
                      cc == CURLE_OK && status >= 200 && status < 300);
  curl_multi_remove_handle(r->multi, x->e);
  x->next_free = r->free_x;
  r->free_x = x;
}

static void progress(run_t *r, bool final) {
  if (r->o.quiet && !final) return;
  int64_t now = now_rel(r);
  if (final && r->last_progress_us && now - r->last_progress_us < 500000) return; /* just printed */
  r->last_progress_us = now;
  double t = (double)now / 1e6;
  printf("[%6.1fs] orders sent %lld/%lld answered %lld: ok %lld, rejected %lld (sold_out %lld, over_limit %lld, "
         "not_on_sale %lld), 503 %lld; paid %lld, cancelled %lld; in flight %d\n",
         t, r->sent, r->o.users + r->again_sent, r->done, r->ok,
         r->rej_sold_out + r->rej_over_limit + r->rej_not_on_sale + r->rej_other, r->rej_sold_out,
         r->rej_over_limit, r->rej_not_on_sale, r->unavailable + r->unknown, r->paid, r->cancelled, r->inflight);
  fflush(stdout);
}

/* The sale: returns false if the loop itself failed. */
static bool run_sale(run_t *r) {
  r->multi = curl_multi_init();
  if (!r->multi) return false;
  curl_multi_setopt(r->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)r->o.connections);
  curl_multi_setopt(r->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)r->o.connections);
  curl_multi_setopt(r->multi, CURLMOPT_MAXCONNECTS, (long)r->o.connections);
  r->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
  r->hdrs = curl_slist_append(r->hdrs, "Expect:");

  /* Arrivals: uniform over the window, each user once (plus follow-ups). */
  for (long long u = 0; u < r->o.users; u++) {
    job_t j = {.at_us = (int64_t)(rnd01(r) * r->o.window_s * 1e6), .kind = REQ_ORDER, .user = (int)u,
               .qty = 1 + (int)(rnd(r) % (unsigned)r->o.limit)};
    if (!heap_push(&r->heap, j)) return false;
  }
  r->t0_us = svc_now_us();
  r->t0_wall_ms = txc_unix_ms();
  int64_t next_progress = 1000000;
  for (;;) {
    int64_t now = now_rel(r);
    while (r->heap.n && r->heap.v[0].at_us <= now) {
      job_t j = heap_pop(&r->heap);
      if (!start_job(r, &j)) {
        fprintf(stderr, "flashsale: could not start a request\n");
        return false;
      }
    }
    if (r->heap.n == 0 && r->inflight == 0) break;
    int running = 0;
    curl_multi_perform(r->multi, &running);
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(r->multi, &left))) {
      if (m->msg != CURLMSG_DONE) continue;
      xfer_t *x = NULL;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
      finish_xfer(r, x, m->data.result);
    }
    now = now_rel(r);
    if (now >= next_progress) {
      progress(r, false);
      next_progress += 1000000;
    }
    if (r->heap.n == 0 && r->inflight == 0) break;
    /* Sleep in poll until a socket is ready, the next job is due or the
     * next progress line is. */
    int64_t wait = next_progress - now;
    if (r->heap.n && r->heap.v[0].at_us - now < wait) wait = r->heap.v[0].at_us - now;
    long ct = -1;
    curl_multi_timeout(r->multi, &ct);
    if (ct >= 0 && ct * 1000 < wait) wait = ct * 1000;
    if (wait < 0) wait = 0;
    int ms = (int)((wait + 999) / 1000);
    if (wait > 0 || r->inflight > 0) curl_multi_poll(r->multi, NULL, 0, ms, NULL);
  }
  progress(r, true);
  return true;
}

/* ------------------------------------------------------ event metrics */

#define MAX_GROUPS 16

/* The order-event counters of the services, from their /metrics. */
typedef struct ev_group {
  char name[64];
  double consumed, retried, dead_lettered;
  double commits; /* local transactions that applied them: consumed / commits is the events per commit */
} ev_group_t;

typedef struct ev_metrics {
  double published; /* order-service: txc_events_published_total; < 0 unknown */
  ev_group_t g[MAX_GROUPS];
  size_t ng;
} ev_metrics_t;

/* GET base/metrics: the text (malloc'd) or NULL. */
static char *get_metrics(const char *base) {
  if (!base) return NULL;
  char url[512], err[256];
  snprintf(url, sizeof(url), "%s/metrics", base);
  char *t = svc_http_get_text(url, 5000, err, sizeof(err));
  if (!t) fprintf(stderr, "flashsale: could not read %s: %s\n", url, err);
  return t;
}

static ev_group_t *ev_group(ev_metrics_t *m, const char *name) {
  for (size_t i = 0; i < m->ng; i++)
    if (strcmp(m->g[i].name, name) == 0) return &m->g[i];
  if (m->ng == MAX_GROUPS) return NULL;
  ev_group_t *g = &m->g[m->ng++];
  memset(g, 0, sizeof(*g));
  snprintf(g->name, sizeof(g->name), "%s", name);
  return g;
}

/* The consumer groups' counters (txc_events_<what>_total{group="..."})
 * and the relay's txc_events_published_total from Prometheus text 't'. */
static void parse_ev_metrics(const char *t, ev_metrics_t *m) {
  static const char *const what[] = {"txc_events_consumed_total", "txc_events_retried_total",
                                     "txc_events_dead_lettered_total", "txc_events_commits_total"};
  for (const char *line = t; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    if (*line == '#') continue;
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[256];
    if (len >= sizeof(buf)) continue;
    memcpy(buf, line, len);
    buf[len] = '\0';
    char *sp = strrchr(buf, ' ');
    if (!sp) continue;
    *sp = '\0';
    double v = strtod(sp + 1, NULL);
    if (strcmp(buf, "txc_events_published_total") == 0) {
      m->published = v;
      continue;
    }
    for (int k = 0; k < 4; k++) {
      size_t n = strlen(what[k]);
      const char *lab = "{group=\"";
      if (strncmp(buf, what[k], n) != 0 || strncmp(buf + n, lab, strlen(lab)) != 0) continue;
      char *name = buf + n + strlen(lab), *q = strchr(name, '"');
      if (!q || strcmp(q, "\"}") != 0) continue;
      *q = '\0';
      ev_group_t *g = ev_group(m, name);
      if (!g) continue;
      if (k == 0) g->consumed = v;
      else if (k == 1) g->retried = v;
      else if (k == 2) g->dead_lettered = v;
      else g->commits = v;
    }
  }
}

/* One scrape of order-service, stock-service and event-consumers (those
 * whose URL is set). */
static void scrape_events(ev_metrics_t *m, const char *order_url, const char *stock_url, const char *events_url) {
  memset(m, 0, sizeof(*m));
  m->published = -1;
  const char *urls[3] = {order_url, stock_url, events_url};
  for (int i = 0; i < 3; i++) {
    char *t = get_metrics(urls[i]);
    if (t) parse_ev_metrics(t, m);
    free(t);
  }
}

/* after - before, per counter; a counter that went down (its service
 * restarted during the run) counts from the restart. */
static double ev_delta(double before, double after) { return after >= before ? after - before : after; }

static void ev_diff(const ev_metrics_t *before, const ev_metrics_t *after, ev_metrics_t *d) {
  memset(d, 0, sizeof(*d));
  d->published = after->published < 0 ? -1 : ev_delta(before->published < 0 ? 0 : before->published, after->published);
  for (size_t i = 0; i < after->ng; i++) {
    const ev_group_t *a = &after->g[i], *b = NULL;
    for (size_t k = 0; k < before->ng; k++)
      if (strcmp(before->g[k].name, a->name) == 0) b = &before->g[k];
    ev_group_t *g = &d->g[d->ng++];
    snprintf(g->name, sizeof(g->name), "%s", a->name);
    g->consumed = ev_delta(b ? b->consumed : 0, a->consumed);
    g->retried = ev_delta(b ? b->retried : 0, a->retried);
    g->dead_lettered = ev_delta(b ? b->dead_lettered : 0, a->dead_lettered);
    g->commits = ev_delta(b ? b->commits : 0, a->commits);
  }
}

/* ------------------------------------------------------------- report */

static void usage(FILE *f) {
  fprintf(f,
          "usage: flashsale [options]\n"
          "\n"
          "Replays a flash sale against order-service (ORDER_URL) and checks the\n"
          "invariants on PostgreSQL (STOCK_PG_URL, ORDERS_PG_URL, TC_PG_URL, and\n"
          "EVENTS_PG_URL if set) and Redis (REDIS_URL); the report's event counters come\n"
          "from the /metrics of ORDER_URL, STOCK_URL and EVENTS_URL.\n"
          "\n"
          "  --users N        users (default 2000)\n"
          "  --window S       seconds over which they arrive (default 10)\n"
          "  --tickets N      tickets on sale (default 500)\n"
          "  --buckets N      stock buckets (default 5)\n"
          "  --limit N        tickets per user (default 2)\n"
          "  --activity ID    activity id to create (default: the next free one)\n"
          "  --pay PCT        percent of orders paid afterwards (default 50)\n"
          "  --cancel PCT     percent of orders cancelled afterwards (default 10)\n"
          "  --again PCT      percent of buyers who try to buy again (default 20)\n"
          "  --dup PCT        percent of answered purchases sent once more with their\n"
          "                   Idempotency-Key, expecting the same answer (default 0)\n"
          "  --no-keys        purchases without an Idempotency-Key, never retried\n"
          "                   (what the idempotent submit costs, against the default)\n"
          "  --think-ms MS    longest pause before paying or cancelling (default 1000)\n"
          "  --connections N  requests on the wire at once (default 64)\n"
          "  --settle S       seconds to wait for the coordinator to finish (default 30)\n"
          "  --seed N         random seed (default: from the clock)\n"
          "  --json FILE      also write the report as JSON (with its \"timeline\")\n"
          "  --html FILE      also write the report as one HTML page with SVG charts\n"
          "                   (orders/s, p50/p99, requests in flight, stock per bucket)\n"
          "  --quiet          no progress lines\n"
          "  --check-only     no sale: check the invariants of --activity as it is\n"
          "  --open-in MS     the sale opens MS ms after seeding (stock-service's window job\n"
          "                   opens it) instead of at once; checks it opens and closes on time\n"
          "  --close-after MS the sale closes MS ms after it opened (with --open-in; default\n"
          "                   the arrival window + --think-ms + 3000)\n"
          "\n"
          "exit status: 0 invariants hold, 1 an invariant failed, 2 usage, 3 could not run\n");
}

static bool parse_opts(int argc, char **argv, opts_t *o) {
  static const struct option lo[] = {
    {"users", required_argument, NULL, 'u'},   {"window", required_argument, NULL, 'w'},
    {"tickets", required_argument, NULL, 't'}, {"buckets", required_argument, NULL, 'b'},
    {"limit", required_argument, NULL, 'l'},   {"activity", required_argument, NULL, 'a'},
    {"pay", required_argument, NULL, 'p'},     {"cancel", required_argument, NULL, 'c'},
    {"again", required_argument, NULL, 'g'},   {"think-ms", required_argument, NULL, 'k'},
    {"dup", required_argument, NULL, 'd'},     {"no-keys", no_argument, NULL, 'K'},
    {"connections", required_argument, NULL, 'n'}, {"settle", required_argument, NULL, 's'},
    {"seed", required_argument, NULL, 'S'},    {"json", required_argument, NULL, 'j'},
    {"html", required_argument, NULL, 'H'},
    {"quiet", no_argument, NULL, 'q'},         {"help", no_argument, NULL, 'h'},
    {"check-only", no_argument, NULL, 'C'},
    {"open-in", required_argument, NULL, 'O'}, {"close-after", required_argument, NULL, 'E'},
    {NULL, 0, NULL, 0}};
  *o = (opts_t){.users = 2000, .window_s = 10, .tickets = 500, .buckets = 5, .limit = 2, .pay_pct = 50,
                .cancel_pct = 10, .again_pct = 20, .think_ms = 1000, .connections = 64, .settle_s = 30,
                .seed = (unsigned)time(NULL) ^ (unsigned)getpid()};
  int c, li = -1;
  long long v;
  while ((c = getopt_long(argc, argv, "h", lo, &li)) != -1) {
    bool ok = true;
    switch (c) {
    case 'u': ok = svc_parse_ll(optarg, 1, 10000000, &o->users); break;
    case 'w': {
      char *end = NULL;
      errno = 0;
      o->window_s = strtod(optarg, &end);
      ok = !errno && end && !*end && o->window_s >= 0 && o->window_s <= 3600;
      break;
    }
    case 't': ok = svc_parse_ll(optarg, 1, 100000000, &o->tickets); break;
    case 'b': ok = svc_parse_ll(optarg, 1, 10000, &o->buckets); break;
    case 'l': ok = svc_parse_ll(optarg, 1, 100, &o->limit); break;
    case 'a': ok = svc_parse_ll(optarg, 1, INT64_MAX, &o->activity); break;
    case 'p': ok = svc_parse_ll(optarg, 0, 100, &v); o->pay_pct = (int)v; break;
    case 'c': ok = svc_parse_ll(optarg, 0, 100, &v); o->cancel_pct = (int)v; break;
    case 'g': ok = svc_parse_ll(optarg, 0, 100, &v); o->again_pct = (int)v; break;
    case 'd': ok = svc_parse_ll(optarg, 0, 100, &v); o->dup_pct = (int)v; break;
    case 'K': o->no_keys = true; break;
    case 'k': ok = svc_parse_ll(optarg, 0, 600000, &v); o->think_ms = (int)v; break;
    case 'n': ok = svc_parse_ll(optarg, 1, 4096, &v); o->connections = (int)v; break;
    case 's': ok = svc_parse_ll(optarg, 0, 3600, &v); o->settle_s = (int)v; break;
    case 'S': ok = svc_parse_ll(optarg, 0, UINT32_MAX, &v); o->seed = (unsigned)v; break;
    case 'j': o->json_path = optarg; break;
    case 'H': o->html_path = optarg; break;
    case 'q': o->quiet = true; break;
    case 'C': o->check_only = true; break;
    case 'O': ok = svc_parse_ll(optarg, 0, 3600000, &o->open_in_ms); break;
    case 'E': ok = svc_parse_ll(optarg, 1, 86400000, &o->close_after_ms); break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); return false;
    }
    if (!ok) {
      fprintf(stderr, "flashsale: invalid value \"%s\" for --%s\n", optarg, li >= 0 ? lo[li].name : "?");
      return false;
    }
  }
  if (optind < argc) {
    usage(stderr);
    return false;
  }
  if (o->pay_pct + o->cancel_pct > 100) {
    fprintf(stderr, "flashsale: --pay and --cancel add up to more than 100\n");
    return false;
  }
  if (o->buckets > o->tickets) {
    fprintf(stderr, "flashsale: more buckets (%lld) than tickets (%lld)\n", o->buckets, o->tickets);
    return false;
  }
  if (o->check_only && !o->activity) {
    fprintf(stderr, "flashsale: --check-only needs --activity\n");
    return false;
  }
  if (o->seed == 0) o->seed = 1;
  if (o->open_in_ms && !o->close_after_ms)
    o->close_after_ms = (long long)(o->window_s * 1000) + o->think_ms + 3000;
  return true;
}

/* ------------------------------------------------------- sale window */

typedef struct window_view {
  bool asked, ok;
  long long opened_ms, closed_ms;          /* when both said 1, then 2 (0: never) */
  char before[24], after[24];              /* the probes' answers */
} window_view_t;

static void sleep_until_ms(int64_t at) {
  int64_t d = at - txc_unix_ms();
  if (d <= 0) return;
  struct timespec ts = {.tv_sec = d / 1000, .tv_nsec = (d % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* One POST /orders of 'user' (no Idempotency-Key), outside the sale's
 * counters: its answer as "201", the 409's reason, or "HTTP <status>". */
static void probe_order(const run_t *r, long long user, char *out, size_t len) {
  CURL *e = curl_easy_init();
  char url[512], body[160];
  xfer_t x = {.resp.max = XFER_MAX_ANSWER};
  snprintf(url, sizeof(url), "%s/orders", r->order_url);
  snprintf(body, sizeof(body), "{\"activity\":%lld,\"ticket_type\":%d,\"user\":%lld,\"qty\":1}", r->o.activity,
           TICKET_TYPE, user);
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  long status = 0;
  snprintf(out, len, "no answer");
  if (e && h) {
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, txc_buf_curl_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &x.resp);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    if (curl_easy_perform(e) == CURLE_OK && curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK) {
      if (status == 409)
        json_reason(x.resp.p, "reason", out, len);
      else
        snprintf(out, len, "HTTP %ld", status);
    }
  }
  free(x.resp.p);
  curl_slist_free_all(h);
  if (e) curl_easy_cleanup(e);
}

/* Wait until PostgreSQL and Redis both say 'want' (up to 'until_ms'):
 * when they did, or 0. */
static long long wait_status(fs_check_t *ck, const fs_activity_t *a, int want, int64_t until_ms) {
  char err[256];
  for (;;) {
    int pg = -1, rs = -1;
    int64_t now = txc_unix_ms();
    if (fs_sale_status(ck, a, &pg, &rs, err, sizeof(err)) && pg == want && rs == want) return now;
    if (now > until_ms) return 0;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 2000000};
    nanosleep(&ts, NULL);
  }
}

static void print_ms(const char *what, long long ms) {
  char t[TXC_ISO_TIME_MAX];
  txc_iso_time(t, ms);
  printf("%s %s", what, t);
}

/* Before the sale: the probe, then the opening. */
static void window_open(run_t *r, fs_check_t *ck, const fs_activity_t *a, window_view_t *w) {
  w->asked = true;
  print_ms("flashsale: sale window: opens", a->starts_ms);
  print_ms(", closes", a->ends_ms);
  printf("\n");
  probe_order(r, r->o.users + 1, w->before, sizeof(w->before));
  sleep_until_ms(a->starts_ms - 20);
  w->opened_ms = wait_status(ck, a, 1, a->starts_ms + 10000);
  if (w->opened_ms)
    printf("flashsale: sale opened (PostgreSQL and Redis status 1) %+lld ms after starts_at; an order before: %s\n",
           w->opened_ms - a->starts_ms, w->before);
  else
    printf("flashsale: sale did NOT open within 10 s of starts_at; an order before: %s\n", w->before);
  fflush(stdout);
}

/* After the sale: the closing, then the probe. */
static void window_close(run_t *r, fs_check_t *ck, const fs_activity_t *a, window_view_t *w) {
  if (!w->opened_ms) return;
  sleep_until_ms(a->ends_ms - 20);
  w->closed_ms = wait_status(ck, a, 2, a->ends_ms + 10000);
  probe_order(r, r->o.users + 1, w->after, sizeof(w->after));
  if (w->closed_ms)
    printf("flashsale: sale closed (PostgreSQL and Redis status 2) %+lld ms after ends_at; an order after: %s\n",
           w->closed_ms - a->ends_ms, w->after);
  else
    printf("flashsale: sale did NOT close within 10 s of ends_at; an order after: %s\n", w->after);
  w->ok = w->opened_ms >= a->starts_ms && w->closed_ms >= a->ends_ms && strcmp(w->before, "not_on_sale") == 0 &&
          strcmp(w->after, "not_on_sale") == 0;
  fflush(stdout);
}

int main(int argc, char **argv) {
  run_t r = {0};
  if (!parse_opts(argc, argv, &r.o)) return 2;
  r.rng = r.o.seed;
  svc_log_init("flashsale", "FLASHSALE_LOG_LEVEL");
  fs_env_t env;
  if (!fs_env_load(&env)) return 3;
  r.order_url = env.order_url;
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return 3;

  fs_check_t *ck = fs_check_new(&env);
  if (!ck) return 3;
  fs_activity_t act = {.activity = r.o.activity, .ticket_type = TICKET_TYPE, .tickets = r.o.tickets,
                       .buckets = r.o.buckets, .limit = r.o.limit,
                       .open_in_ms = r.o.check_only ? 0 : r.o.open_in_ms, .close_after_ms = r.o.close_after_ms};
  window_view_t win = {0};
  char err[512];
  if (r.o.check_only ? !fs_load(ck, &act, err, sizeof(err)) : !fs_seed(ck, &act, err, sizeof(err))) {
    fprintf(stderr, "flashsale: could not %s the activity: %s\n", r.o.check_only ? "load" : "seed", err);
    fs_check_free(ck);
    return 3;
  }
  if (r.o.check_only) {
    r.o.tickets = act.tickets;
    r.o.buckets = act.buckets;
    r.o.limit = act.limit;
    r.o.users = 0;
  }
  r.o.activity = act.activity;
  const char *stock_url = svc_env_str("STOCK_URL", NULL), *events_url = svc_env_str("EVENTS_URL", NULL);
  ev_metrics_t ev_before, ev_after, ev;
  scrape_events(&ev_before, r.order_url, stock_url, events_url);
  bool ran = true;
  if (!r.o.check_only) {
    printf("flashsale: activity %lld: %lld tickets in %lld buckets, limit %lld per user, loaded into Redis; "
           "%lld users within %.1fs (seed %u)\n",
           act.activity, act.tickets, act.buckets, act.limit, r.o.users, r.o.window_s, r.o.seed);
    fflush(stdout);
    if (r.o.json_path || r.o.html_path) {
      r.timeline = fs_timeline_new();
      char why[256];
      if (r.timeline && !fs_timeline_start_stock(r.timeline, env.stock_pg, act.activity, svc_now_us, why, sizeof(why)))
        fprintf(stderr, "flashsale: the report will have no stock chart: %s\n", why);
    }
    if (act.open_in_ms) window_open(&r, ck, &act, &win);
    ran = run_sale(&r);
    fs_timeline_stop_stock(r.timeline);
    if (act.open_in_ms) window_close(&r, ck, &act, &win);
  }
  double dur_s = (double)(r.last_us - r.first_us) / 1e6;
  if (dur_s <= 0) dur_s = 1e-6;
  svc_sort_ll(r.lat_us, r.nlat);

  fs_result_t res = {0};
  fs_client_view_t view = {.accepted = r.accepted, .naccepted = r.nacc, .paid = r.paid_ids, .npaid = r.npaid,
                           .keyed = r.keyed, .nkeyed = r.nkeyed};
  fs_check_run(ck, &act, &view, r.o.settle_s, &res);
  scrape_events(&ev_after, r.order_url, stock_url, events_url);
  ev_diff(&ev_before, &ev_after, &ev);
  double globals_per_order = r.ok ? (double)res.committed / (double)r.ok : -1;

  double p50 = svc_pct_ms(r.lat_us, r.nlat, 50), p95 = svc_pct_ms(r.lat_us, r.nlat, 95), p99 = svc_pct_ms(r.lat_us, r.nlat, 99);
  double pmax = r.nlat ? (double)r.lat_us[r.nlat - 1] / 1000.0 : 0;
  /* the queued order mode: from the click to the order made (the check
   * above waited for the queue to drain) */
  size_t created = 0;
  double created_p50 = -1, created_p99 = -1;
  if (r.nqueued) {
    long long *clat = malloc(r.nqueued * sizeof(long long));
    int64_t last_ms = 0;
    if (clat && fs_created_latency(env.orders_pg, r.queued_ids, r.queued_ms, r.nqueued, 30, clat, &created,
                                   &last_ms)) {
      created_p50 = svc_pct_ms(clat, created, 50);
      created_p99 = svc_pct_ms(clat, created, 99);
    }
    free(clat);
  }
  double tps = (double)r.done / dur_s;
  printf("\n== flash sale report: activity %lld ==\n", act.activity);
  printf("users %lld, tickets %lld in %lld buckets, limit %lld, window %.1fs\n", r.o.users, r.o.tickets,
         r.o.buckets, r.o.limit, r.o.window_s);
  printf("orders: %lld requests (%lld repeat purchases) in %.2fs = %.0f requests/s; %lld accepted (%lld tickets)\n",
         r.done, r.again_sent, dur_s, tps, r.ok, r.ok_tickets);
  printf("rejected: sold_out %lld, over_limit %lld, not_on_sale %lld, other %lld\n", r.rej_sold_out,
         r.rej_over_limit, r.rej_not_on_sale, r.rej_other);
  printf("failed: 503 unavailable %lld, 503 unknown outcome %lld, transport %lld, other HTTP %lld\n",
         r.unavailable, r.unknown, r.transport, r.http_other);
  printf("idempotency keys: retried %lld (same key); sent again after the answer %lld: same answer %lld, "
         "differing %lld\n",
         r.retried, r.dup_sent, r.dup_same, r.dup_differ);
  printf("after the sale: paid %lld (failed %lld), cancelled %lld (failed %lld)\n", r.paid, r.pay_fail,
         r.cancelled, r.cancel_fail);
  printf("latency of POST /orders: p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.2f ms\n", p50, p95, p99, pmax);
  if (r.nqueued)
    printf("queued order mode: %lld answered 202, %zu made; from the click to the order made: p50 %.2f ms, "
           "p99 %.2f ms\n",
           r.queued, created, created_p50, created_p99);
  printf("stock (PostgreSQL): sold %lld, frozen %lld, available %lld of %lld\n", res.sold, res.frozen,
         res.available, res.stock);
  printf("global transactions: committed %lld, rolled back %lld, unfinished %lld", res.committed, res.rolled_back,
         res.unfinished);
  if (res.other_final) printf(", other final states %lld", res.other_final);
  printf(" (settled in %.1fs)\n", res.settle_s);
  if (globals_per_order >= 0)
    printf("global transactions per accepted order: %.2f\n", globals_per_order);
  else
    printf("global transactions per accepted order: n/a (no order accepted)\n");
  if (ev.published >= 0)
    printf("events: published %.0f", ev.published);
  else
    printf("events: published unknown (order-service /metrics unreadable)");
  for (size_t i = 0; i < ev.ng; i++)
    printf("%s %s %.0f/%.0f/%.0f", i ? "," : "; consumed/retried/dead-lettered by group:", ev.g[i].name,
           ev.g[i].consumed, ev.g[i].retried, ev.g[i].dead_lettered);
  printf("\n");
  size_t shown = 0;
  for (size_t i = 0; i < ev.ng; i++)
    if (ev.g[i].commits > 0)
      printf("%s %s %.1f", shown++ ? "," : "events per consumer commit by group:", ev.g[i].name,
             ev.g[i].consumed / ev.g[i].commits);
  if (shown) printf("\n");
  if (win.asked) {
    char t1[TXC_ISO_TIME_MAX], t2[TXC_ISO_TIME_MAX];
    txc_iso_time(t1, act.starts_ms);
    txc_iso_time(t2, act.ends_ms);
    printf("sale window %s .. %s: opened %+lld ms, closed %+lld ms after its times; orders outside: %s, %s: %s\n",
           t1, t2, win.opened_ms ? win.opened_ms - act.starts_ms : -1,
           win.closed_ms ? win.closed_ms - act.ends_ms : -1, win.before, win.after, win.ok ? "ok" : "FAILED");
  }
  fs_print_invariants(&res, stdout);
  printf("invariants: %s\n", res.ok ? "all hold" : "FAILED");

  if (r.o.json_path || r.o.html_path) {
    json_t *j = json_pack(
      "{s:I,s:I,s:I,s:I,s:I,s:I,s:{s:I,s:I,s:I,s:I},s:I,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:b}", "activity",
      (json_int_t)act.activity, "users", (json_int_t)r.o.users, "tickets", (json_int_t)r.o.tickets, "buckets",
      (json_int_t)r.o.buckets, "sold", (json_int_t)res.sold, "frozen", (json_int_t)res.frozen, "rejected",
      "sold_out", (json_int_t)r.rej_sold_out, "over_limit", (json_int_t)r.rej_over_limit, "not_on_sale",
      (json_int_t)r.rej_not_on_sale, "other", (json_int_t)r.rej_other, "committed", (json_int_t)res.committed,
      "rolled_back", (json_int_t)res.rolled_back, "unfinished", (json_int_t)res.unfinished, "tps", tps, "p50_ms",
      p50, "p95_ms", p95, "p99_ms", p99, "duration_s", dur_s, "invariants_ok", res.ok);
    json_object_set_new(j, "requests", json_integer(r.done));
    if (r.nqueued) {
      json_object_set_new(j, "queued", json_integer(r.queued));
      json_object_set_new(j, "queued_made", json_integer((json_int_t)created));
      json_object_set_new(j, "created_p50_ms", json_real(created_p50));
      json_object_set_new(j, "created_p99_ms", json_real(created_p99));
    }
    json_object_set_new(j, "accepted", json_integer(r.ok));
    json_object_set_new(j, "paid", json_integer(r.paid));
    json_object_set_new(j, "cancelled", json_integer(r.cancelled));
    json_object_set_new(j, "pay_failed", json_integer(r.pay_fail));
    json_object_set_new(j, "cancel_failed", json_integer(r.cancel_fail));
    json_object_set_new(j, "unavailable", json_integer(r.unavailable + r.transport + r.http_other));
    json_object_set_new(j, "unknown_outcome", json_integer(r.unknown));
    json_object_set_new(j, "max_ms", json_real(pmax));
    json_object_set_new(j, "limit", json_integer(r.o.limit));
    json_object_set_new(j, "window_s", json_real(r.o.window_s));
    json_object_set_new(j, "retried", json_integer(r.retried));
    json_object_set_new(j, "duplicates", json_pack("{s:I,s:I,s:I}", "sent", (json_int_t)r.dup_sent, "same",
                                                   (json_int_t)r.dup_same, "differing", (json_int_t)r.dup_differ));
    json_object_set_new(j, "invariants", fs_invariants_json(&res));
    if (win.asked)
      json_object_set_new(
        j, "sale_window",
        json_pack("{s:I,s:I,s:o,s:o,s:s,s:s,s:b}", "starts_at_ms", (json_int_t)act.starts_ms, "ends_at_ms",
                  (json_int_t)act.ends_ms, "opened_late_ms",
                  win.opened_ms ? json_integer(win.opened_ms - act.starts_ms) : json_null(), "closed_late_ms",
                  win.closed_ms ? json_integer(win.closed_ms - act.ends_ms) : json_null(), "before_open",
                  win.before, "after_close", win.after, "ok", win.ok));
    json_object_set_new(j, "globals_per_accepted_order", globals_per_order >= 0 ? json_real(globals_per_order)
                                                                                : json_null());
    json_t *groups = json_object();
    for (size_t i = 0; i < ev.ng; i++)
      json_object_set_new(groups, ev.g[i].name,
                          json_pack("{s:I,s:I,s:I,s:I}", "consumed", (json_int_t)ev.g[i].consumed, "retried",
                                    (json_int_t)ev.g[i].retried, "dead_lettered", (json_int_t)ev.g[i].dead_lettered,
                                    "commits", (json_int_t)ev.g[i].commits));
    json_object_set_new(j, "events",
                        json_pack("{s:o,s:o}", "published",
                                  ev.published >= 0 ? json_integer((json_int_t)ev.published) : json_null(), "groups",
                                  groups));
    if (r.timeline) json_object_set_new(j, "timeline", fs_timeline_json(r.timeline, 0));
    if (r.o.json_path && json_dump_file(j, r.o.json_path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
      fprintf(stderr, "flashsale: could not write %s\n", r.o.json_path);
    if (r.o.html_path) {
      FILE *hf = fopen(r.o.html_path, "w");
      int wrote = hf ? fs_report_html(j, hf) : -1;
      if ((hf && fclose(hf) != 0) || wrote != 0) fprintf(stderr, "flashsale: could not write %s\n", r.o.html_path);
    }
    json_decref(j);
  }

  fs_check_free(ck);
  fs_timeline_free(r.timeline);
  free(r.lat_us);
  free(r.accepted);
  free(r.queued_ids);
  free(r.queued_ms);
  free(r.paid_ids);
  free(r.keyed);
  free(r.heap.v);
  while (r.free_x) {
    xfer_t *x = r.free_x;
    r.free_x = x->next_free;
    curl_easy_cleanup(x->e);
    curl_slist_free_all(x->hdrs);
    free(x->resp.p);
    free(x);
  }
  curl_slist_free_all(r.hdrs);
  if (r.multi) curl_multi_cleanup(r.multi);
  curl_global_cleanup();
  if (!ran) return 3;
  return res.ok && (!win.asked || win.ok) ? 0 : 1;
}
