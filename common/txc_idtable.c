/*
 * txc_idtable.c - the intrusive hash table of requests by id
 * (txc_idtable.h).
 */
#include "txc_idtable.h"

#include <stdlib.h>

static size_t slot(const txc_idtable_t *t, uint64_t id) {
  return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - t->bits));
}

int txc_idtable_init(txc_idtable_t *t, unsigned min_bits) {
  t->bits = min_bits < 1 ? 1 : min_bits > 30 ? 30 : min_bits;
  t->n = 0;
  t->b = calloc((size_t)1 << t->bits, sizeof(*t->b));
  return t->b ? 0 : -1;
}

void txc_idtable_free(txc_idtable_t *t) {
  free(t->b);
  t->b = NULL;
  t->n = 0;
}

static void grow(txc_idtable_t *t) {
  if (t->bits >= 30) return;
  unsigned bits = t->bits + 1;
  txc_idnode_t **nb = calloc((size_t)1 << bits, sizeof(*nb));
  if (!nb) return; /* chains just get longer */
  size_t old_n = (size_t)1 << t->bits;
  txc_idnode_t **old = t->b;
  t->b = nb;
  t->bits = bits;
  for (size_t i = 0; i < old_n; i++) {
    for (txc_idnode_t *n = old[i], *next; n; n = next) {
      next = n->next;
      size_t s = slot(t, n->id);
      n->next = nb[s];
      nb[s] = n;
    }
  }
  free(old);
}

void txc_idtable_insert(txc_idtable_t *t, txc_idnode_t *n) {
  if (t->n >= ((size_t)1 << t->bits)) grow(t);
  size_t s = slot(t, n->id);
  n->next = t->b[s];
  t->b[s] = n;
  t->n++;
}

txc_idnode_t *txc_idtable_find(const txc_idtable_t *t, uint64_t id) {
  for (txc_idnode_t *n = t->b[slot(t, id)]; n; n = n->next)
    if (n->id == id) return n;
  return NULL;
}

bool txc_idtable_remove(txc_idtable_t *t, txc_idnode_t *n) {
  txc_idnode_t **pp = &t->b[slot(t, n->id)];
  while (*pp && *pp != n) pp = &(*pp)->next;
  if (!*pp) return false;
  *pp = n->next;
  n->next = NULL;
  t->n--;
  return true;
}
