/*
 * test_order_events.c - the order events' way out of the orders database
 * and into the consumers: examples/svc_outbox.c's relay and
 * examples/svc_consumer.c's idempotent consumer groups, against a real
 * Redis stream and the real orders and events databases.
 *
 * Usage: scripts/with-servers --pg --redis -- test_order_events
 *
 * NOTES
 *   Servers: REDIS_URL, ORDERS_PG_URL and EVENTS_PG_URL come from
 *   scripts/with-servers.
 *   Each test writes its own stream and group, so tests do not depend on
 *   their order.  The consumer's apply records each effect in the table
 *   consumer_test_effect, in the consumer's transaction, and refuses
 *   (SVC_EV_RETRY) the order ids a test marks as poison.
 *
 *   What is checked:
 *     - a read of many events applies them in one transaction (one
 *       commit), each once; a repeat of an event in the same read (the
 *       same business key) is counted a duplicate and has no second
 *       effect; nothing stays pending;
 *     - a batch with a poison event falls back to one transaction per
 *       event: every other event is applied once, the poison one retried
 *       and dead-lettered after max_deliveries, with no effect;
 *     - a group's batch apply (apply_batch): one call and one commit for
 *       30 events; a poison event among 10 makes it refuse, and the
 *       events go one by one (9 applied, the poison dead-lettered);
 *     - the linger: an event that finds the consumer idle is applied at
 *       once; two groups of five that come during the pause after that
 *       read are one commit with CONSUMER_LINGER_MS=1000 (the read after
 *       a read waits); with 0, and the first group applied before the
 *       second comes, two;
 *     - the relay's pacing, the same way: an event kicked to an idle relay
 *       is published by a pass at once; two groups of five, each kicked,
 *       are one pass with linger_ms 1000, two with 0; every event is in
 *       the stream once.
 *   The counters asserted are the consumer's own (svc_consumer_stats),
 *   the effects and dead letters are read from PostgreSQL, the pending
 *   entries from Redis (XPENDING).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "itest_redis.h"
#include "svc_consumer.h"
#include "svc_outbox.h"

static const char *redis_url, *events_url, *orders_url;
static redisContext *raw;
static PGconn *pg, *orders;

/* A command on the test's own Redis connection (itest_rcmd). */
#define rcmd(...) itest_rcmd(raw, __VA_ARGS__)

#define MAX_POISON 4
typedef struct {
  long long poison[MAX_POISON];
  int npoison;
  int batch_calls;
} apply_arg_t;

/* The first of the 'n' events that is poison to 'a', or NULL. */
static const svc_event_t *poison_in(const apply_arg_t *a, const svc_event_t *const *evs, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < a->npoison; k++)
      if (a->poison[k] == evs[i]->order_id) return evs[i];
  return NULL;
}

/* The effects of 'n' events: one consumer_test_effect row each, in one
 * INSERT; refused (SVC_EV_RETRY) when one of them is poison. */
static svc_ev_result_t insert_effects(PGconn *conn, const apply_arg_t *a, const svc_event_t *const *evs, size_t n,
                                      char *why, size_t whylen) {
  const svc_event_t *bad = poison_in(a, evs, n);
  if (bad) {
    snprintf(why, whylen, "order %lld is poison (the test refuses it)", bad->order_id);
    return SVC_EV_RETRY;
  }
  json_t *rows = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(rows, json_pack("{s:s,s:I,s:I}", "b", evs[i]->biz_key, "o", (json_int_t)evs[i]->order_id,
                                          "e", (json_int_t)evs[i]->event_id));
  char *js = json_dumps(rows, JSON_COMPACT);
  json_decref(rows);
  const char *p[1] = {js};
  PGresult *r = PQexecParams(conn,
                             "INSERT INTO consumer_test_effect (biz_key, order_id, event_id) SELECT r.b, r.o, r.e"
                             " FROM jsonb_to_recordset($1::jsonb) AS r(b text, o bigint, e bigint)",
                             1, NULL, p, NULL, NULL, 0);
  free(js);
  bool ok = PQresultStatus(r) == PGRES_COMMAND_OK && atoll(PQcmdTuples(r)) == (long long)n;
  if (!ok) snprintf(why, whylen, "%s", PQerrorMessage(conn));
  PQclear(r);
  return ok ? SVC_EV_DONE : SVC_EV_RETRY;
}

static svc_ev_result_t test_apply(PGconn *conn, const svc_event_t *ev, void *arg, char *why, size_t whylen) {
  return insert_effects(conn, arg, &ev, 1, why, whylen);
}

/* The batch form: the same INSERT for all the events, its calls counted
 * (a poison one refuses the whole batch: the consumer then goes one by
 * one). */
static svc_ev_result_t test_apply_batch(PGconn *conn, const svc_event_t *const *evs, size_t n, void *arg, char *why,
                                        size_t whylen) {
  apply_arg_t *a = arg;
  a->batch_calls++;
  return insert_effects(conn, a, evs, n, why, whylen);
}

/* The number in the first column of 'sql' (one text parameter 'arg', or
 * none) on 'conn'. */
static long long count_on(PGconn *conn, const char *sql, const char *arg) {
  const char *p[1] = {arg};
  PGresult *r = PQexecParams(conn, sql, arg ? 1 : 0, NULL, arg ? p : NULL, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s: %s", sql, PQerrorMessage(conn));
  long long n = atoll(PQgetvalue(r, 0, 0));
  PQclear(r);
  return n;
}

/* XADD an order.paid event of order 'order_id' with event id 'event_id'. */
static void publish(const char *stream, long long event_id, long long order_id) {
  char eid[24], oid[24], payload[128];
  snprintf(eid, sizeof(eid), "%lld", event_id);
  snprintf(oid, sizeof(oid), "%lld", order_id);
  snprintf(payload, sizeof(payload), "{\"activity\":7,\"ticket_type\":1,\"bucket\":0,\"user\":%lld,\"qty\":1}",
           order_id);
  redisReply *r = rcmd("XADD %s * event_id %s type order.paid order_id %s payload %s", stream, eid, oid, payload);
  assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
  freeReplyObject(r);
}

/* 'n' events: event ids and orders counting up from the first ones. */
static void publish_range(const char *stream, long long first_event, long long first_order, int n) {
  for (int i = 0; i < n; i++) publish(stream, first_event + i, first_order + i);
}

/* 'n' events at once (MULTI: any reader sees all or none). */
static void publish_at_once(const char *stream, long long first, int n) {
  freeReplyObject(rcmd("MULTI"));
  publish_range(stream, first, first, n);
  freeReplyObject(rcmd("EXEC"));
}

static long long pending(const char *stream, const char *group) {
  redisReply *r = rcmd("XPENDING %s %s", stream, group);
  long long n = r->type == REDIS_REPLY_ARRAY && r->elements > 0 ? r->element[0]->integer : -1;
  freeReplyObject(r);
  return n;
}

static void wait_handled(svc_consumer_t *c, uint64_t n, svc_consumer_stats_t *st) {
  for (int i = 0; i < 1000; i++) {
    svc_consumer_stats(c, st);
    if (st->consumed + st->duplicates + st->dead_lettered >= n) return;
    usleep(10 * 1000);
  }
  fail_msg("the consumer handled %llu of %llu events in 10 s", (unsigned long long)(st->consumed + st->duplicates +
           st->dead_lettered), (unsigned long long)n);
}

static svc_consumer_t *start(const char *stream, const char *group, apply_arg_t *arg, int max_deliveries,
                             svc_event_apply_batch_fn batch) {
  static const int64_t backoff[1] = {100};
  char err[256] = "";
  svc_consumer_opts_t o = {.redis_url = redis_url, .pg_url = events_url, .stream = stream, .group = group,
                           .apply = test_apply, .apply_batch = batch, .arg = arg,
                           .max_deliveries = max_deliveries, .backoff_ms = backoff, .nbackoff = 1};
  svc_consumer_t *c = svc_consumer_start(&o, err, sizeof(err));
  if (!c) fail_msg("could not start the consumer: %s", err);
  return c;
}

/* A consumer of what 'stream' holds, until it handled 'n' events: its
 * counters. */
static svc_consumer_stats_t consume(const char *stream, const char *group, apply_arg_t *arg, int max_deliveries,
                                    svc_event_apply_batch_fn batch, uint64_t n) {
  svc_consumer_stats_t st;
  svc_consumer_t *c = start(stream, group, arg, max_deliveries, batch);
  wait_handled(c, n, &st);
  svc_consumer_stop(c);
  return st;
}

static int setup(void **state) {
  (void)state;
  redis_url = getenv("REDIS_URL");
  events_url = getenv("EVENTS_PG_URL");
  orders_url = getenv("ORDERS_PG_URL");
  if (!redis_url || !events_url || !orders_url) return 0;
  raw = itest_redis_connect(redis_url);
  pg = PQconnectdb(events_url);
  orders = PQconnectdb(orders_url);
  if (!raw || PQstatus(pg) != CONNECTION_OK || PQstatus(orders) != CONNECTION_OK) return -1;
  PGresult *r = PQexec(pg, "CREATE TABLE IF NOT EXISTS consumer_test_effect (biz_key text NOT NULL,"
                           " order_id bigint NOT NULL, event_id bigint NOT NULL)");
  int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
  PQclear(r);
  setenv("CONSUMER_LINGER_MS", "50", 1);
  return rc;
}

static int teardown(void **state) {
  (void)state;
  if (raw) redisFree(raw);
  if (pg) PQfinish(pg);
  if (orders) PQfinish(orders);
  return 0;
}

#define SKIP_WITHOUT_SERVERS()                                                                                        \
  do {                                                                                                                \
    if (!redis_url || !events_url || !orders_url) skip();                                                            \
  } while (0)

/* 40 events and a repeat of one, all in the stream before the consumer
 * starts: its first read takes them all, one transaction applies them. */
static void test_one_read_one_commit(void **state) {
  (void)state;
  SKIP_WITHOUT_SERVERS();
  const char *stream = "test:consumer:batch", *group = "batch";
  publish_range(stream, 1001, 5001, 40);
  publish(stream, 1007, 5007); /* the relay published event 1007 again */
  apply_arg_t arg = {0};
  svc_consumer_stats_t st = consume(stream, group, &arg, 3, NULL, 41);
  assert_int_equal(st.consumed, 40);
  assert_int_equal(st.duplicates, 1);
  assert_int_equal(st.commits, 1);
  assert_int_equal(st.retried, 0);
  assert_int_equal(pending(stream, group), 0);
  assert_int_equal(count_on(pg, "SELECT count(*) FROM consumer_test_effect WHERE order_id BETWEEN 5001 AND 5040", NULL),
                   40);
  assert_int_equal(count_on(pg, "SELECT count(DISTINCT order_id) FROM consumer_test_effect"
                                " WHERE order_id BETWEEN 5001 AND 5040", NULL), 40);
  assert_int_equal(count_on(pg, "SELECT count(*) FROM consumed_event WHERE consumer_group = $1", group), 40);
  redisReply *m = rcmd("GET txc:consumed:{%s}:order.paid:5007", group);
  assert_int_equal(m->type, REDIS_REPLY_STRING);
  assert_string_equal(m->str, "done");
  freeReplyObject(m);
}

/* A poison event among 20: the batch fails, its events go one by one. */
static void test_poison_in_a_batch(void **state) {
  (void)state;
  SKIP_WITHOUT_SERVERS();
  const char *stream = "test:consumer:poison", *group = "poison";
  publish_range(stream, 2001, 6001, 20);
  apply_arg_t arg = {.poison = {6013}, .npoison = 1};
  svc_consumer_stats_t st = consume(stream, group, &arg, 2, NULL, 20);
  assert_int_equal(st.consumed, 19);
  assert_int_equal(st.dead_lettered, 1);
  assert_int_equal(st.retried, 1);  /* the first delivery failed, the second gave up */
  assert_int_equal(st.commits, 19); /* one by one after the batch was rolled back */
  assert_int_equal(pending(stream, group), 0);
  assert_int_equal(count_on(pg, "SELECT count(*) FROM consumer_test_effect WHERE order_id BETWEEN 6001 AND 6020", NULL),
                   19);
  assert_int_equal(count_on(pg, "SELECT count(*) FROM consumer_test_effect WHERE order_id = 6013", NULL), 0);
  assert_int_equal(count_on(pg, "SELECT count(*) FROM consumed_event WHERE consumer_group = $1", group), 19);
  assert_int_equal(count_on(pg, "SELECT count(*) FROM dead_letter WHERE consumer_group = $1"
                                " AND biz_key = 'order.paid:6013' AND state = 'DEAD'", group), 1);
}

/* A group with a batch apply: 30 events in one call of it and one commit;
 * with a poison event among them, the call refuses and the events go one
 * by one through the apply. */
static void test_batch_apply(void **state) {
  (void)state;
  SKIP_WITHOUT_SERVERS();
  publish_range("test:consumer:bapply", 3001, 9001, 30);
  apply_arg_t arg = {0};
  svc_consumer_stats_t st = consume("test:consumer:bapply", "bapply", &arg, 3, test_apply_batch, 30);
  assert_int_equal(arg.batch_calls, 1);
  assert_int_equal(st.consumed, 30);
  assert_int_equal(st.commits, 1);
  assert_int_equal(count_on(pg, "SELECT count(*) FROM consumer_test_effect WHERE order_id BETWEEN 9001 AND 9030", NULL),
                   30);

  publish_range("test:consumer:bapply2", 3101, 9101, 10);
  apply_arg_t arg2 = {.poison = {9105}, .npoison = 1};
  st = consume("test:consumer:bapply2", "bapply2", &arg2, 1, test_apply_batch, 10);
  assert_int_equal(arg2.batch_calls, 1);
  assert_int_equal(st.consumed, 9);
  assert_int_equal(st.dead_lettered, 1);
  assert_int_equal(st.commits, 9);
  assert_int_equal(count_on(pg, "SELECT count(*) FROM consumer_test_effect WHERE order_id BETWEEN 9101 AND 9110", NULL),
                   9);
}

/* One event to an idle consumer, then two groups of five: the commits it
 * took.  With a linger of a second both groups come while the consumer
 * waits out the pause after its first read.  Without one, the test lets
 * the first group be applied before the second comes. */
static uint64_t commits_for_split_arrival(const char *linger, const char *stream, const char *group,
                                          long long first_order) {
  setenv("CONSUMER_LINGER_MS", linger, 1);
  apply_arg_t arg = {0};
  svc_consumer_t *c = start(stream, group, &arg, 3, NULL);
  setenv("CONSUMER_LINGER_MS", "50", 1);
  svc_consumer_stats_t st;
  publish(stream, first_order, first_order);
  wait_handled(c, 1, &st); /* idle: applied without waiting for more */
  assert_int_equal(st.commits, 1);
  publish_at_once(stream, first_order + 1, 5);
  if (strcmp(linger, "0") == 0) wait_handled(c, 6, &st);
  publish_at_once(stream, first_order + 6, 5);
  wait_handled(c, 11, &st);
  assert_int_equal(st.consumed, 11);
  assert_int_equal(pending(stream, group), 0);
  svc_consumer_stop(c);
  return st.commits;
}

static void test_linger(void **state) {
  (void)state;
  SKIP_WITHOUT_SERVERS();
  assert_int_equal(commits_for_split_arrival("1000", "test:consumer:linger", "linger", 7000), 2);
  assert_int_equal(commits_for_split_arrival("0", "test:consumer:nolinger", "nolinger", 7100), 3);
}

/* 'n' events in order_outbox, committed together, then the relay kicked. */
static void outbox_add(svc_relay_t *r, long long first_order, int n) {
  char err[256] = "";
  PQclear(PQexec(orders, "BEGIN"));
  for (int i = 0; i < n; i++) {
    json_t *payload = json_pack("{s:i,s:i,s:i,s:I,s:i}", "activity", 7, "ticket_type", 1, "bucket", 0, "user",
                                (json_int_t)(first_order + i), "qty", 1);
    if (!svc_outbox_add(orders, "order.paid", first_order + i, payload, err, sizeof(err)))
      fail_msg("could not add an event: %s", err);
  }
  PGresult *c = PQexec(orders, "COMMIT");
  assert_int_equal(PQresultStatus(c), PGRES_COMMAND_OK);
  PQclear(c);
  svc_relay_kick(r);
}

/* Until the relay made 'passes' passes and published 'n' events. */
static void wait_relay(svc_relay_t *r, uint64_t passes, uint64_t n, svc_relay_stats_t *st) {
  for (int i = 0; i < 1000; i++) {
    svc_relay_stats(r, st);
    if (st->passes >= passes && st->published >= n) return;
    usleep(10 * 1000);
  }
  fail_msg("the relay made %llu passes and published %llu of %llu events in 10 s", (unsigned long long)st->passes,
           (unsigned long long)st->published, (unsigned long long)n);
}

/* One event to the idle relay, then two groups of five: the passes they
 * took (as for the consumer: with a linger of a second both groups come
 * in the pause after the first pass; without, the test lets the first
 * group be published before the second comes). */
static uint64_t relay_passes_for_split_arrival(unsigned linger_ms, long long first_order) {
  char err[256] = "";
  svc_relay_opts_t o = {.pg_url = orders_url, .redis_url = redis_url, .stream = "test:relay",
                        .poll_ms = 60000, /* passes come from kicks only */
                        .linger_ms = linger_ms};
  svc_relay_t *r = svc_relay_start(&o, err, sizeof(err));
  if (!r) fail_msg("could not start the relay: %s", err);
  svc_relay_stats_t st;
  wait_relay(r, 1, 0, &st); /* its first pass, at once */
  outbox_add(r, first_order, 1);
  wait_relay(r, 0, 1, &st); /* idle: published without waiting */
  uint64_t passes = st.passes;
  outbox_add(r, first_order + 1, 5);
  if (linger_ms == 0) wait_relay(r, 0, 6, &st);
  outbox_add(r, first_order + 6, 5);
  wait_relay(r, 0, 11, &st);
  assert_int_equal(st.published, 11);
  svc_relay_stop(r);
  char so[24];
  snprintf(so, sizeof(so), "%lld", first_order);
  assert_int_equal(count_on(orders, "SELECT count(*) FROM order_outbox WHERE order_id >= $1::bigint"
                                    " AND order_id < $1::bigint + 11 AND stream_seq IS NOT NULL", so), 11);
  return st.passes - passes;
}

static void test_relay_pacing(void **state) {
  (void)state;
  SKIP_WITHOUT_SERVERS();
  assert_int_equal(relay_passes_for_split_arrival(1000, 8000), 1);
  assert_int_equal(relay_passes_for_split_arrival(0, 8100), 2);
  redisReply *n = rcmd("XLEN test:relay");
  assert_int_equal(n->integer, 22); /* each event once */
  freeReplyObject(n);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_one_read_one_commit),
    cmocka_unit_test(test_poison_in_a_batch),
    cmocka_unit_test(test_linger),
    cmocka_unit_test(test_batch_apply),
    cmocka_unit_test(test_relay_pacing),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
