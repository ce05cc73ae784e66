/*
 * tc_admin.h - the admin socket: a Unix stream socket on the node's loop
 * where operators (tcctl, socat, nc -U) send one-line commands and get one
 * line of JSON back.
 *
 * NOTES
 *   Access control, in this order:
 *     1. the socket file is created under umask 0177 and then chmod'ed to
 *        admin.socket_mode (0600 by default), so between bind and chmod
 *        nobody but the owner can connect;
 *     2. every accepted connection's peer credentials (SO_PEERCRED) are
 *        checked: the uid must be tcd's own, or listed in admin.allow_uids,
 *        or the peer's gid must be listed in admin.allow_gids.  Anyone else
 *        gets {"ok":false,"code":"denied",...} and is disconnected.
 *   Abstract sockets are refused (a path must name a file), and so is a
 *   path that libuv would truncate.  A stale socket file left by a killed
 *   tcd is replaced; a live one (something accepts on it) is an error.
 *
 *   Framing: a request is one line ending in '\n' (a '\r' before it is
 *   ignored), at most admin.max_request bytes.  Lines are served one at a
 *   time, in order; while one runs the connection is not read.  A longer
 *   line gets {"ok":false,"code":"too_long"} and the connection is closed
 *   (it cannot be resynchronised); bytes without a newline at end of input
 *   or after admin.idle_ms of silence get {"ok":false,"code":"incomplete"}
 *   and are never executed (a truncated XID could name another
 *   transaction).  A connection idle for admin.idle_ms is closed.  A peer
 *   that pipelines requests without reading the answers is no longer read
 *   once 16 answers wait for it.  A repair whose connection goes away
 *   meanwhile still completes (and is logged); only its answer is lost.
 *
 *   Answers: {"ok":true,...} or {"ok":false,"code":C,"error":"..."} where
 *   C is one of bad_request, refused, not_found, store, denied, too_long,
 *   incomplete, shutting_down, internal.  See tc_admin_exec.c for the
 *   shape of each command's answer.
 *
 *   Thread: the node's loop thread only.
 */
#ifndef TC_ADMIN_H
#define TC_ADMIN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tc_admin_cmd.h"

#include "tc_ctx.h"

typedef struct tc_adm_req tc_adm_req_t;
/* Runs one command (tc_admin_exec.c's tc__admin_execute): it must answer
 * through tc__admin_finish exactly once, possibly later. */
typedef void (*tc_admin_exec_fn)(tc_adm_req_t *req);

typedef struct tc_admin_stats {
  uint64_t accepted, denied, requests, bad_requests, refused, repairs, too_long, incomplete, idle_closed;
  int connections;
} tc_admin_stats_t;

/* Bind and listen on ctx->cfg->admin_socket; commands go to 'exec'.
 * Returns 0 (*out set), or a negative code with 'err' saying what failed
 * (bad path, socket in use, bind/chmod failure, bad allow-list). */
int tc_admin_start(tc_ctx_t *ctx, tc_admin_exec_fn exec, tc_admin_t **out, char *err, size_t errlen);
/* Stop listening, close every connection, wait for commands in flight;
 * 'done' runs when everything is released (the socket file is removed). */
void tc_admin_close(tc_admin_t *adm, void (*done)(void *arg), void *arg);
void tc_admin_get_stats(const tc_admin_t *adm, tc_admin_stats_t *out);

/* ---- used between tc_admin.c and tc_admin_exec.c ---- */

/* One command being served.  Allocated by tc_admin.c; the executor must
 * call tc__admin_finish() exactly once, possibly much later. */
struct tc_adm_req {
  tc_admin_t *adm;
  tc_ctx_t *ctx;
  void *conn; /* opaque to the executors */
  unsigned uid, gid;
  int pid;
  tc_adm_cmd_t cmd;
};

/* Send 'answer' (taken; NULL means out of memory) and free 'req'. */
void tc__admin_finish(tc_adm_req_t *req, json_t *answer);
/* {"ok":false,"code":code,"error":...}; never NULL unless out of memory. */
json_t *tc__admin_error(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string of 's' with bytes that are not valid UTF-8 replaced by
 * '?' (store text is shown, never trusted); "" for NULL. */
json_t *tc__admin_str(const char *s);
/* Count a repair that changed something (for stats). */
void tc__admin_count_repair(tc_admin_t *adm, bool refused);

#endif /* TC_ADMIN_H */
