/*
 * txc_httpguard.c - see txc_httpguard.h.
 */
#include "txc_httpguard.h"
#include "txc_worker.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

typedef struct slot {
  struct MHD_Connection *conn; /* NULL: free */
  int fd;
  int64_t since_ms; /* opened, or the last request answered */
  bool receiving;   /* a request is arriving: the deadline runs */
  unsigned next_free;
} slot_t;

struct txc_httpguard {
  txc_worker_t job; /* a pass over the slots every 250 ms; its mu guards the rest */
  unsigned capacity, deadline_ms;
  unsigned free_head; /* == capacity: none free */
  slot_t *slots;
  _Atomic uint64_t cut, unguarded;
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *guard_main(void *arg) {
  txc_httpguard_t *g = arg;
  while (txc_worker_sleep(&g->job, 250)) {
    pthread_mutex_lock(&g->job.mu);
    int64_t now = now_ms();
    for (unsigned i = 0; i < g->capacity; i++) {
      slot_t *s = &g->slots[i];
      if (!s->conn || !s->receiving || now - s->since_ms < (int64_t)g->deadline_ms) continue;
      /* the peer sees its connection end; libmicrohttpd sees the peer go */
      shutdown(s->fd, SHUT_RDWR);
      s->receiving = false;
      g->cut++;
    }
    pthread_mutex_unlock(&g->job.mu);
  }
  return NULL;
}

txc_httpguard_t *txc_httpguard_new(unsigned capacity, unsigned deadline_ms) {
  txc_httpguard_t *g = calloc(1, sizeof(*g));
  if (!g) return NULL;
  g->slots = calloc(capacity ? capacity : 1, sizeof(slot_t));
  if (!g->slots) {
    free(g);
    return NULL;
  }
  g->capacity = capacity;
  g->deadline_ms = deadline_ms;
  for (unsigned i = 0; i < capacity; i++) g->slots[i].next_free = i + 1;
  g->free_head = 0;
  if (txc_worker_start(&g->job, guard_main, g) != 0) {
    free(g->slots);
    free(g);
    return NULL;
  }
  return g;
}

void txc_httpguard_free(txc_httpguard_t *g) {
  if (!g) return;
  txc_worker_stop(&g->job);
  free(g->slots);
  free(g);
}

void txc_httpguard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
  txc_httpguard_t *g = cls;
  pthread_mutex_lock(&g->job.mu);
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (g->free_head == g->capacity || !ci) {
      g->unguarded++;
      *socket_context = NULL;
    } else {
      unsigned i = g->free_head;
      slot_t *s = &g->slots[i];
      g->free_head = s->next_free;
      *s = (slot_t){.conn = conn, .fd = ci->connect_fd, .since_ms = now_ms(), .receiving = true};
      *socket_context = s;
    }
  } else if (*socket_context) { /* MHD_CONNECTION_NOTIFY_CLOSED */
    slot_t *s = *socket_context;
    s->conn = NULL;
    s->receiving = false;
    s->next_free = g->free_head;
    g->free_head = (unsigned)(s - g->slots);
    *socket_context = NULL;
  }
  pthread_mutex_unlock(&g->job.mu);
}

static slot_t *slot_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

void txc_httpguard_received(txc_httpguard_t *g, struct MHD_Connection *conn) {
  slot_t *s = g ? slot_of(conn) : NULL;
  if (!s) return;
  pthread_mutex_lock(&g->job.mu);
  s->receiving = false;
  pthread_mutex_unlock(&g->job.mu);
}

void txc_httpguard_completed(txc_httpguard_t *g, struct MHD_Connection *conn) {
  slot_t *s = g ? slot_of(conn) : NULL;
  if (!s) return;
  pthread_mutex_lock(&g->job.mu);
  s->since_ms = now_ms();
  s->receiving = true;
  pthread_mutex_unlock(&g->job.mu);
}

uint64_t txc_httpguard_cut(const txc_httpguard_t *g) { return g ? g->cut : 0; }
uint64_t txc_httpguard_unguarded(const txc_httpguard_t *g) { return g ? g->unguarded : 0; }
