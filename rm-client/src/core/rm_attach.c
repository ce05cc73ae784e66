/*
 * rm_attach.c - what the layers above the core keep in a client
 * (rm_internal.h): the resource manager attached to it (rm__rm_get,
 * rm__rm_peek) and local mode's counters (rm__local_counters).  A leaf of
 * the core: the calls and the serving of the TC's requests read the
 * attached state here without reaching into the client's life cycle.
 */
#include "rm_core.h"

void *rm__rm_peek(rm_client_t *c) { return c ? atomic_load_explicit(&c->rm, memory_order_acquire) : NULL; }

void *rm__rm_get(rm_client_t *c, const rm_rm_ops_t *ops, void *(*create)(rm_client_t *c)) {
  void *rm = rm__rm_peek(c);
  if (rm || !c || !ops || !create) return rm;
  uv_mutex_lock(&c->rm_mu);
  rm = atomic_load_explicit(&c->rm, memory_order_relaxed);
  if (!rm && (rm = create(c)) != NULL) {
    c->rm_ops = ops;
    atomic_store_explicit(&c->rm, rm, memory_order_release);
  }
  uv_mutex_unlock(&c->rm_mu);
  return rm;
}

rm_local_counters_t *rm__local_counters(rm_client_t *c) { return c ? &c->local : NULL; }

