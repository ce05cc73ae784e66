/*
 * txc_idtable.h - an intrusive hash table of requests by their 64-bit id
 * (chained, Fibonacci hashing, doubling when as full as it has buckets):
 * the element embeds a txc_idnode_t.  The one hash table of the project:
 * librmclient's calls awaiting an answer, tcd's calls to its RMs.  Not
 * thread-safe.
 */
#ifndef TXC_IDTABLE_H
#define TXC_IDTABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct txc_idnode {
  uint64_t id;
  struct txc_idnode *next;
} txc_idnode_t;

typedef struct txc_idtable {
  txc_idnode_t **b;
  unsigned bits; /* 2^bits buckets */
  size_t n;
} txc_idtable_t;

/* The element that embeds node 'n' as its member 'field'. */
#define TXC_IDTABLE_ELEM(n, type, field) ((type *)(void *)((char *)(n) - offsetof(type, field)))

/* 2^min_bits buckets to start with.  0, or -1 out of memory. */
int txc_idtable_init(txc_idtable_t *t, unsigned min_bits);
/* Free the buckets (not the elements). */
void txc_idtable_free(txc_idtable_t *t);
/* Add 'n' (its id set).  When the table cannot grow, chains just get
 * longer: inserting never fails. */
void txc_idtable_insert(txc_idtable_t *t, txc_idnode_t *n);
/* The node with 'id', or NULL. */
txc_idnode_t *txc_idtable_find(const txc_idtable_t *t, uint64_t id);
/* Take 'n' out; false when it was not in. */
bool txc_idtable_remove(txc_idtable_t *t, txc_idnode_t *n);
static inline size_t txc_idtable_count(const txc_idtable_t *t) { return t->n; }

#endif /* TXC_IDTABLE_H */
