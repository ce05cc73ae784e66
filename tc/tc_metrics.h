/*
 * tc_metrics.h - Prometheus metrics, /healthz and /readyz over HTTP
 * (libmicrohttpd), for one node.
 *
 * NOTES
 *   Two threads, one rule: the HTTP handlers run on libmicrohttpd's own
 *   thread and never touch loop state.  The loop thread publishes a
 *   snapshot (node, store, server, recovery and admin counters, plus the
 *   result of the last store probe) every TC_METRICS_PUBLISH_MS under a
 *   mutex; a handler copies the snapshot under the same mutex and formats
 *   it.  The probe (tc_read_probe, tc_store_read.h) runs on the store's
 *   reader connections every TC_METRICS_PROBE_MS: sessions by status
 *   (active sessions gauge), retry queue depth, and the tc rows of
 *   schema_version.
 *
 *   GET /metrics   text format 0.0.4, every name prefixed txc_
 *   GET /healthz   200 while the loop is alive (the snapshot is younger
 *                  than TC_METRICS_STALE_MS), 503 otherwise
 *   GET /readyz    200 when the node serves, PostgreSQL answered the last
 *                  probe and schema_version holds every sql/tc version
 *                  this build expects (TC_SCHEMA_VERSIONS); 503 with the
 *                  reasons otherwise
 */
#ifndef TC_METRICS_H
#define TC_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tc_ctx.h"

#define TC_METRICS_PUBLISH_MS 500
#define TC_METRICS_PROBE_MS 1000
#define TC_METRICS_STALE_MS 5000

typedef struct tc_metrics tc_metrics_t;

/* Start serving on ctx->cfg->metrics_listen ("host:port"; port 0 picks a
 * free one, see tc_metrics_port).  0, or a negative code with 'err'. */
int tc_metrics_start(tc_ctx_t *ctx, tc_metrics_t **out, char *err, size_t errlen);
/* Stop the HTTP thread (joins it) and release everything; 'done' runs
 * once the timer is closed and the probe in flight (if any) finished. */
void tc_metrics_close(tc_metrics_t *m, void (*done)(void *arg), void *arg);
int tc_metrics_port(const tc_metrics_t *m);

/* Record one phase-two drive of 'ns' nanoseconds (loop thread). */

#endif /* TC_METRICS_H */
