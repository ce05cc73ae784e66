/*
 * txc_heap.h - an intrusive binary min-heap of deadlines: the element
 * embeds a txc_heap_node_t (its key and its place), the heap holds
 * pointers to the nodes, so an element is found, moved and removed in
 * O(log n) without a search.  The one heap of the project: librmclient's
 * call deadlines and tcd's store job deadlines.  Not thread-safe.
 */
#ifndef TXC_HEAP_H
#define TXC_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct txc_heap_node {
  uint64_t key; /* smallest first */
  size_t idx;   /* place in the heap; SIZE_MAX when not in one */
} txc_heap_node_t;

typedef struct txc_heap {
  txc_heap_node_t **a;
  size_t len, cap;
} txc_heap_t;

#define TXC_HEAP_NODE_INIT {0, SIZE_MAX}

/* The element that embeds node 'n' as its member 'field'. */
#define TXC_HEAP_ELEM(n, type, field) ((type *)(void *)((char *)(n) - offsetof(type, field)))

static inline void txc_heap_node_init(txc_heap_node_t *n) {
  n->key = 0;
  n->idx = SIZE_MAX;
}
static inline bool txc_heap_contains(const txc_heap_node_t *n) { return n->idx != SIZE_MAX; }
static inline size_t txc_heap_len(const txc_heap_t *h) { return h->len; }
/* The smallest key's node, or NULL when empty. */
static inline txc_heap_node_t *txc_heap_min(const txc_heap_t *h) { return h->len ? h->a[0] : NULL; }

void txc_heap_init(txc_heap_t *h);
/* Free the heap's array (not the elements). */
void txc_heap_free(txc_heap_t *h);
/* Add 'n' (not in a heap) with 'key'.  0, or -1 when the array could not
 * grow (nothing changed). */
int txc_heap_push(txc_heap_t *h, txc_heap_node_t *n, uint64_t key);
/* Take 'n' out (nothing if it is not in). */
void txc_heap_remove(txc_heap_t *h, txc_heap_node_t *n);
/* Give 'n' (in the heap) a new key. */
void txc_heap_update(txc_heap_t *h, txc_heap_node_t *n, uint64_t key);

#endif /* TXC_HEAP_H */
