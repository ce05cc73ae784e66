/*
 * rm_prefilter_conn.h - the prefilter's Redis connections: a pool of
 * blocking hiredis contexts used by the calling threads themselves, with
 * timeouts on every socket operation, reconnect backoff, script loading and
 * EVALSHA with a NOSCRIPT retry.
 *
 * NOTES
 *   Why blocking connections and no loop thread.  The public calls are
 *   blocking; a call takes a connection, sends one command, reads its reply
 *   and gives the connection back, all on its own thread.  Nothing crosses
 *   threads, so a call costs its own two system calls plus the wake-up of
 *   its reply, and concurrent callers use concurrent connections exactly as
 *   a multi-connection client (redis-benchmark -c N) does.  hiredis 0.14's
 *   async API on libuv has no command timeouts; here every blocking socket
 *   operation has one (SO_RCVTIMEO/SO_SNDTIMEO through redisSetTimeout, and
 *   an overall deadline per reply), so no call hangs on a stopped or paused
 *   Redis.  One command at a time per connection also makes the damage of a
 *   timeout exact: that connection alone is closed (a late reply must never
 *   be read as the answer to the next command).
 *
 *   Only connect, command formatting and the reply parser come from
 *   hiredis; the socket I/O is ours: send() with MSG_NOSIGNAL (a library
 *   must not die of SIGPIPE nor install a handler), and we know whether a
 *   command left at all (RM_E_CONN_LOST: it did not run) or was sent
 *   without an answer (RM_E_UNKNOWN_OUTCOME).
 *
 *   Stale connections: an idle connection whose socket is readable (Redis
 *   closed it: restart, timeout, CLIENT KILL) is dropped before use, so a
 *   Redis restart costs no unknown outcomes to calls made after it.
 *
 *   Thread safety: the pool's lists and counters are under its mutex; a
 *   connection taken from the pool belongs to one thread until given back.
 *
 *   Sentinel (a redis+sentinel:// URL, rm_redis_sentinel.h): the master's
 *   address is pool state ('master', under 'mu').  A new connection goes
 *   to it, asking the sentinels first when it is not known (at start, and
 *   after anything that suggests a failover: a connection broken or timed
 *   out, a connect refused, a READONLY reply, a ROLE that is not master),
 *   one thread at a time ('resolve_mu', held only while asking).  Every
 *   new connection, in either mode, reads ROLE and the run_id in its
 *   set-up round trip: a Sentinel URL requires ROLE master, and a new
 *   address or run_id counts as a master change ('master_changes', and
 *   the hook of rm__pf_pool_set_hook: the compensator's reconciliation).
 *   The backoff after failed connects is at most 250 ms then, so the
 *   first calls after a promotion find the new master quickly.
 */
#ifndef RM_PREFILTER_CONN_H
#define RM_PREFILTER_CONN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "rm_client.h"
#include "rm_log.h"
#include "rm_util.h"
#include "rm_prefilter_keys.h"
#include "rm_prefilter_sock.h"
#include "rm_redis_sentinel.h"

#define RM_PF_SHA_LEN 40

typedef struct rm_pf_conn {
  redisContext *ctx;
  char host[RM_PF_HOST_MAX]; /* where it is connected (messages) */
  int port;
  struct rm_pf_conn *next;     /* idle list */
  uint64_t idle_since_ms;      /* monotonic */
  char sha[RM_PF_S__COUNT][RM_PF_SHA_LEN + 1]; /* as this connection loaded them */
} rm_pf_conn_t;

typedef struct rm_pf_pool {
  /* Immutable after init. */
  rm_pf_url_t url;
  unsigned cmd_timeout_ms;
  unsigned connect_timeout_ms;
  unsigned max_conns;
  unsigned backoff_min_ms, backoff_max_ms;
  const char *script_text[RM_PF_S__COUNT];
  size_t script_len[RM_PF_S__COUNT];
  rm_logger_t *log;

  /* Under 'mu'. */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a connection came back or a slot freed */
  rm_pf_conn_t *idle;
  unsigned open;     /* idle + in use + being connected */
  unsigned failures; /* consecutive failed connects */
  uint64_t retry_at_ms; /* no connect before this (monotonic) */
  /* Sentinel: the master as last resolved; !master_known: ask first. */
  rm_pf_hostport_t master;
  bool master_known;
  unsigned sentinel_next; /* the sentinel to ask first */
  /* The master the last new connection reached ("" run_id: none yet). */
  rm_pf_hostport_t seen;
  char seen_run_id[RM_REDIS_RUN_ID_MAX];
  void (*on_change)(void *arg); /* called under 'mu': must not block */
  void *on_change_arg;

  pthread_mutex_t resolve_mu; /* one thread asks the sentinels at a time */

  atomic_uint_fast64_t connects, connect_failures, noscript_reloads, stale_closed, master_changes;
} rm_pf_pool_t;

/* 0, or RM_E_INVALID (a script missing from the embedded table),
 * RM_E_NOMEM. */
int rm__pf_pool_init(rm_pf_pool_t *p, const rm_pf_url_t *url, unsigned cmd_timeout_ms,
                     unsigned connect_timeout_ms, unsigned max_conns, unsigned backoff_max_ms,
                     rm_logger_t *log);
/* Closes every idle connection; none may be in use. */
void rm__pf_pool_destroy(rm_pf_pool_t *p);
unsigned rm__pf_pool_open(rm_pf_pool_t *p);



/*
 * Take a connection (an idle one, or a new one: connected, AUTH/SELECT,
 * every script loaded) waiting at most the command timeout for a free
 * slot.  0; RM_E_CONN_LOST (cannot connect now: Redis down, or in the
 * backoff after failed connects); RM_E_DEADLINE (pool exhausted); RM_E_NOMEM.
 */
int rm__pf_conn_get(rm_pf_pool_t *p, rm_pf_conn_t **out);
/* Give 'c' back; 'broken': close it instead (after a transport error, or
 * when its state is unknown, e.g. inside MULTI). */
void rm__pf_conn_put(rm_pf_pool_t *p, rm_pf_conn_t *c, bool broken);

/*
 * Send 'n' commands (formatted by redisFormatCommandArgv) on 'c' in one
 * write and read their 'n' replies into 'replies' (the caller frees each
 * with freeReplyObject; NULL entries on failure).  0; RM_E_CONN_LOST (nothing
 * was sent); RM_E_UNKNOWN_OUTCOME (sent, and a reply missing: timeout,
 * closed, protocol error); after an error the connection must be put back
 * broken.
 */
int rm__pf_conn_pipeline(rm_pf_pool_t *p, rm_pf_conn_t *c, size_t n, char *const *cmds,
                         const size_t *lens, redisReply **replies);
/* One command given as argv. */
int rm__pf_conn_command(rm_pf_pool_t *p, rm_pf_conn_t *c, int argc, const char **argv,
                        const size_t *argvlen, redisReply **reply);

/* How long one script call waits in all while a reconciliation holds its
 * activity (the script answers RM_PF_LUA_HELD) before it gives up with
 * RM_PF_E_HELD: longer than the longest hold (RM_PF_HOLD_MAX_MS), so that
 * one hold never surfaces as an error. */
#define RM_PF_HOLD_MAX_MS 2000u
#define RM_PF_HOLD_WAIT_MS 3000u

/*
 * Run 'script' with EVALSHA: 'nkeys' keys then 'nargs' arguments (strings,
 * NUL-terminated).  Takes a connection, re-loads the script once on
 * NOSCRIPT, gives the connection back.  0 and '*reply' (any type,
 * including errors: the caller interprets it and frees it); else the codes
 * of rm__pf_conn_get and rm__pf_conn_pipeline.  A script that answers
 * RM_PF_LUA_HELD changed nothing: it runs again after a short sleep (2,
 * 4, 8 .. 25 ms), up to RM_PF_HOLD_WAIT_MS in all, then RM_PF_E_HELD.
 */
int rm__pf_eval(rm_pf_pool_t *p, int script, int nkeys, const char *const *keys, int nargs,
                const char *const *args, redisReply **reply);

/* A master change calls 'fn(arg)' (NULL: none) under the pool's mutex:
 * it must only note it (a compensator's kick). */
void rm__pf_pool_set_hook(rm_pf_pool_t *p, void (*fn)(void *arg), void *arg);

/* Check the master now (the compensator's thread, once a second): with
 * Sentinel, ask the sentinels and, if they name another address, drop
 * the idle connections; then, in either mode, take a connection and give
 * it back (a stale one is replaced, and a new one compares its master
 * with the last).  0 or the codes of rm__pf_conn_get. */
int rm__pf_master_probe(rm_pf_pool_t *p);

/* The SHA1 of 'script' as Redis computed it (takes a connection). */
int rm__pf_script_sha(rm_pf_pool_t *p, int script, char sha[RM_PF_SHA_LEN + 1]);

#endif /* RM_PREFILTER_CONN_H */
