/*
 * console_sampler.h - the console's memory of the last minutes: once a
 * second, the stock of each activity (the stock database) and the
 * order-service's request counters and latency histogram (its /metrics),
 * kept in a ring of CONSOLE_SAMPLES samples.
 *
 * NOTES
 *   Why sample instead of asking the databases for a history: the
 *   orders table has no index on its creation time (one more index on the
 *   hot insert costs every order WAL and a page), and the latency of an
 *   answer is known only to the service that gave it.  A scraper, as
 *   Prometheus is, costs the sale one small read a second.
 *
 *   From /metrics, route POST /orders of
 *   txc_http_request_duration_seconds (every activity together: the
 *   route label has no activity), summed over the services given: the
 *   requests and the accepted ones (2xx) per second, and p50 / p99 of the
 *   answers in that second, interpolated inside the histogram's buckets
 *   as Prometheus' histogram_quantile does.  A counter that went down (a
 *   service restarted) counts from zero again.
 *
 *   Thread: its own; console_sampler_json may be called from any thread.
 */
#ifndef CONSOLE_SAMPLER_H
#define CONSOLE_SAMPLER_H

#include <jansson.h>
#include <stdint.h>

#include "console_db.h"

#define CONSOLE_SAMPLES 600 /* ten minutes at one a second */
#define CONSOLE_SAMPLE_MS 1000
#define CONSOLE_ACTIVITIES 16  /* the newest ones followed */
#define CONSOLE_METRICS_URLS 8
#define CONSOLE_METRICS_MAX (4u << 20) /* bytes of one /metrics answer */

typedef struct console_sampler console_sampler_t;

/* Start sampling 'stock' (may be NULL) and the /metrics URLs in
 * 'metrics_urls' (comma-separated, may be NULL or empty).  NULL with the
 * reason in 'err'. */
console_sampler_t *console_sampler_start(console_db_t *stock, const char *metrics_urls, char *err, size_t errlen);
void console_sampler_stop(console_sampler_t *s);

/* The samples of the last 'seconds' (at most CONSOLE_SAMPLES) for
 * 'activity' (0: none) as {"interval_ms", "t":[unix ms...],
 * "requests_per_s", "accepted_per_s", "p50_ms", "p99_ms", "available",
 * "frozen", "sold", "last_error"}: arrays of the same length, null where
 * a sample had nothing. */
json_t *console_sampler_json(console_sampler_t *s, int64_t activity, int seconds);

#endif /* CONSOLE_SAMPLER_H */
