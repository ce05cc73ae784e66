/*
 * txc_heap.c - the intrusive min-heap of deadlines (txc_heap.h).
 */
#include "txc_heap.h"

#include <stdlib.h>

static void set(txc_heap_t *h, size_t i, txc_heap_node_t *n) {
  h->a[i] = n;
  n->idx = i;
}

static void up(txc_heap_t *h, size_t i) {
  txc_heap_node_t *n = h->a[i];
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (h->a[p]->key <= n->key) break;
    set(h, i, h->a[p]);
    i = p;
  }
  set(h, i, n);
}

static void down(txc_heap_t *h, size_t i) {
  txc_heap_node_t *n = h->a[i];
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    uint64_t best = n->key;
    if (l < h->len && h->a[l]->key < best) {
      m = l;
      best = h->a[l]->key;
    }
    if (r < h->len && h->a[r]->key < best) m = r;
    if (m == i) break;
    set(h, i, h->a[m]);
    i = m;
  }
  set(h, i, n);
}

void txc_heap_init(txc_heap_t *h) {
  h->a = NULL;
  h->len = h->cap = 0;
}

void txc_heap_free(txc_heap_t *h) {
  free(h->a);
  txc_heap_init(h);
}

int txc_heap_push(txc_heap_t *h, txc_heap_node_t *n, uint64_t key) {
  if (h->len == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 64;
    txc_heap_node_t **a = realloc(h->a, cap * sizeof(*a));
    if (!a) return -1;
    h->a = a;
    h->cap = cap;
  }
  n->key = key;
  set(h, h->len++, n);
  up(h, n->idx);
  return 0;
}

void txc_heap_remove(txc_heap_t *h, txc_heap_node_t *n) {
  size_t i = n->idx;
  if (i == SIZE_MAX) return;
  n->idx = SIZE_MAX;
  txc_heap_node_t *last = h->a[--h->len];
  if (i == h->len) return;
  set(h, i, last);
  up(h, i);
  down(h, last->idx);
}

void txc_heap_update(txc_heap_t *h, txc_heap_node_t *n, uint64_t key) {
  n->key = key;
  up(h, n->idx);
  down(h, n->idx);
}
