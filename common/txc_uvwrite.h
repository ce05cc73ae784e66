/*
 * txc_uvwrite.h - hand a buffer to a libuv stream: what the kernel takes at
 * once goes with uv_try_write, only the rest with uv_write.  The one way
 * tcd's client connections and librmclient's coordinator connections
 * write.  Header only, like txc_pgconn.h (both link libuv themselves;
 * txcommon does not).
 *
 * Why: a uv_write that completes at once still ends in libuv's drain,
 * which calls uv__io_stop(POLLOUT) on a watcher that never had POLLOUT;
 * libuv (1.44, and its later releases) queues the watcher anyway and the
 * next poll issues an epoll_ctl(EPOLL_CTL_MOD) that changes nothing.  One
 * wasted system call per write, about a third of tcd's under tc-bench
 * (strace -c: read, write and epoll_ctl in equal numbers).  uv_try_write
 * uses no request, so nothing is drained when it writes everything.
 */
#ifndef TXC_UVWRITE_H
#define TXC_UVWRITE_H

#include <stddef.h>

#include <uv.h>

/* Write 'len' bytes (0 < len <= INT_MAX) at 'data' to 'stream', which has no
 * write in flight.  Returns 1 when the kernel took all of them (no callback
 * will come, 'req' is unused, 'data' may be reused at once); 0 when the rest
 * went to uv_write(req, ..., cb) ('cb' will be called, 'data' must stay
 * valid until then); or a negative libuv error code, with nothing in
 * flight (the stream is broken: close it). */
static inline int txc_uv_write(uv_write_t *req, uv_stream_t *stream, char *data, size_t len,
                               uv_write_cb cb) {
  uv_buf_t all = uv_buf_init(data, (unsigned)len);
  int n = uv_try_write(stream, &all, 1);
  if (n >= 0 && (size_t)n == len) return 1;
  if (n < 0 && n != UV_EAGAIN) return n;
  size_t done = n > 0 ? (size_t)n : 0;
  uv_buf_t rest = uv_buf_init(data + done, (unsigned)(len - done));
  int rc = uv_write(req, stream, &rest, 1, cb);
  return rc < 0 ? rc : 0;
}

#endif
