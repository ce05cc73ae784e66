/*
 * fs_timeline.h - the flash sale over time, for the report's charts: every
 * request's instants as flashsale's loop finishes it, and the stock of each
 * bucket sampled from the stock database by a thread of its own.
 *
 * NOTES
 *   Recording is a store into an array that grows (bounded: at most
 *   FS_TIMELINE_MAX_REQUESTS requests are kept; the report says how many
 *   were dropped), so the load loop never waits for it.  The stock thread
 *   reads activity_ticket_bucket every FS_TIMELINE_STOCK_MS on its own
 *   connection, a read-only transaction with a statement timeout: it cannot
 *   hold a lock the sale needs.
 *
 *   fs_timeline_json turns it into slots of 'slot_ms' from the first
 *   scheduled request: per slot the purchases scheduled and answered, the
 *   accepted ones (per second), p50/p99 of the purchases answered in it, the
 *   requests in flight at its end, and the last stock sample at or before
 *   its end, per bucket.  Read by fs_report.h.
 */
#ifndef FS_TIMELINE_H
#define FS_TIMELINE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define FS_TIMELINE_MAX_REQUESTS 2000000
#define FS_TIMELINE_MAX_BUCKETS 16 /* buckets drawn one by one; the rest in the totals */
#define FS_TIMELINE_STOCK_MS 200
#define FS_TIMELINE_MAX_SLOTS 600

/* OTHER: a try retried, or a resend: only in flight */
typedef enum { FS_REQ_PURCHASE, FS_REQ_PAY, FS_REQ_CANCEL, FS_REQ_OTHER } fs_req_kind_t;

typedef struct fs_timeline fs_timeline_t;

fs_timeline_t *fs_timeline_new(void);
void fs_timeline_free(fs_timeline_t *t);

/* One finished request: due at 'due_us', on the wire at 'start_us',
 * answered at 'end_us' (microseconds on one clock), 'accepted' (a 2xx). */
void fs_timeline_request(fs_timeline_t *t, fs_req_kind_t kind, int64_t due_us, int64_t start_us, int64_t end_us,
                         bool accepted);

/* Sample the buckets of 'activity' in the stock database 'conninfo' from
 * now until fs_timeline_stop_stock; 'clock_us' is the clock of
 * fs_timeline_request's instants.  false (reason in err) if the thread or
 * its connection could not start: the report then has no stock chart. */
bool fs_timeline_start_stock(fs_timeline_t *t, const char *conninfo, long long activity, int64_t (*clock_us)(void),
                             char *err, size_t errlen);
void fs_timeline_stop_stock(fs_timeline_t *t);

/* The timeline as {"slot_ms", "t_ms":[slot starts, ms from the first due
 * request], "purchases_per_s", "accepted_per_s", "p50_ms", "p99_ms",
 * "in_flight", "available":[...], "frozen":[...], "sold":[...],
 * "buckets":[{"bucket", "available":[...]}...], "dropped"}; arrays of
 * one length, null where a slot has nothing.  slot_ms <= 0: chosen so
 * that the run fits in FS_TIMELINE_MAX_SLOTS slots of at least 100 ms. */
json_t *fs_timeline_json(fs_timeline_t *t, int slot_ms);

#endif /* FS_TIMELINE_H */
