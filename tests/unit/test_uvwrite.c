/*
 * test_uvwrite.c - txc_uv_write (common/txc_uvwrite.h) on a real socket
 * pair: a frame the kernel takes at once needs no request and no
 * callback; one larger than the socket buffer goes partly at
 * once and the rest through uv_write, every byte in order; a broken
 * stream is an error with nothing in flight.
 */
#include <setjmp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "txc_uvwrite.h"

typedef struct fixture {
  uv_loop_t loop;
  uv_pipe_t pipe;  /* the writing end, as a libuv stream */
  int peer;        /* the reading end, a plain descriptor */
  uv_write_t req;
  int callbacks;
  int status;
} fixture_t;

static void on_written(uv_write_t *req, int status) {
  fixture_t *f = req->data;
  f->callbacks++;
  f->status = status;
}

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof(*f));
  int sv[2];
  if (!f || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
  /* a small send buffer, so that a large frame cannot go at once */
  int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  if (uv_loop_init(&f->loop) != 0 || uv_pipe_init(&f->loop, &f->pipe, 0) != 0 ||
      uv_pipe_open(&f->pipe, sv[0]) != 0)
    return -1;
  f->peer = sv[1];
  f->req.data = f;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  if (f->peer >= 0) close(f->peer);
  uv_close((uv_handle_t *)&f->pipe, NULL);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  uv_loop_close(&f->loop);
  free(f);
  return 0;
}

/* Read exactly 'len' bytes from the peer, running the loop meanwhile so
 * that a queued uv_write can go on: wait for the peer to be readable (the
 * loop's writer refills it once the reader makes room), never a fixed
 * sleep. */
static void read_all(fixture_t *f, char *out, size_t len) {
  size_t got = 0;
  while (got < len) {
    uv_run(&f->loop, UV_RUN_NOWAIT);
    struct pollfd pfd = {.fd = f->peer, .events = POLLIN};
    if (poll(&pfd, 1, 10) <= 0) continue;
    ssize_t n = recv(f->peer, out + got, len - got, MSG_DONTWAIT);
    if (n > 0) got += (size_t)n;
  }
}

static void test_small_frame_goes_at_once(void **state) {
  fixture_t *f = *state;
  char frame[] = "a frame of forty bytes, more or less....";
  assert_int_equal(txc_uv_write(&f->req, (uv_stream_t *)&f->pipe, frame, sizeof(frame), on_written), 1);
  /* nothing in flight: the buffer is free at once, no callback comes */
  memset(frame, 'x', sizeof(frame));
  assert_int_equal(uv_stream_get_write_queue_size((uv_stream_t *)&f->pipe), 0);
  uv_run(&f->loop, UV_RUN_NOWAIT);
  assert_int_equal(f->callbacks, 0);
  char back[sizeof(frame)];
  read_all(f, back, sizeof(back));
  assert_string_equal(back, "a frame of forty bytes, more or less....");
}

static void test_large_frame_rest_queued_in_order(void **state) {
  fixture_t *f = *state;
  size_t len = 1u << 20; /* far beyond the socket's buffers */
  char *frame = malloc(len);
  char *back = malloc(len);
  assert_non_null(frame);
  assert_non_null(back);
  for (size_t i = 0; i < len; i++) frame[i] = (char)(i * 131u + (i >> 9));
  assert_int_equal(txc_uv_write(&f->req, (uv_stream_t *)&f->pipe, frame, len, on_written), 0);
  assert_true(uv_stream_get_write_queue_size((uv_stream_t *)&f->pipe) > 0);
  assert_true(uv_stream_get_write_queue_size((uv_stream_t *)&f->pipe) < len); /* part went at once */
  read_all(f, back, len);
  while (f->callbacks == 0) uv_run(&f->loop, UV_RUN_ONCE); /* blocks until the write completes */
  assert_int_equal(f->callbacks, 1);
  assert_int_equal(f->status, 0);
  assert_memory_equal(back, frame, len);
  free(frame);
  free(back);
}

static void test_broken_stream_is_an_error(void **state) {
  fixture_t *f = *state;
  close(f->peer);
  f->peer = -1;
  char frame[] = "nobody reads this";
  int rc = txc_uv_write(&f->req, (uv_stream_t *)&f->pipe, frame, sizeof(frame), on_written);
  assert_true(rc < 0);
  assert_int_equal(uv_stream_get_write_queue_size((uv_stream_t *)&f->pipe), 0);
  uv_run(&f->loop, UV_RUN_NOWAIT);
  assert_int_equal(f->callbacks, 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN); /* as tcd and the services do */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_small_frame_goes_at_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_large_frame_rest_queued_in_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_broken_stream_is_an_error, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
