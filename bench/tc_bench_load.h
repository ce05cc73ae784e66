/*
 * tc_bench_load.h - tc-bench's closed-loop clients, many per thread.
 *
 * Each client is one connection registered as an RM that loops
 *   begin -> 2 x BranchRegister (distinct lock keys) -> commit
 * and answers the BranchCommit/BranchRollback requests for its own
 * branches (the minimal RM).  All clients of a bench_load_run share one
 * libuv loop on the calling thread: 64 blocking client threads cost the
 * 2 vCPUs that tcd and PostgreSQL run on about a third of a core in
 * context switches, which the measurement then charged to the coordinator.
 */
#ifndef TC_BENCH_LOAD_H
#define TC_BENCH_LOAD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bench_client {
  /* in */
  int id;
  char host[64];
  int port;
  /* out: the latencies (ms) of transactions completed while *phase == 1 */
  double *lat;
  size_t nlat, cap;
  uint64_t done, errors;
  char first_error[256];
} bench_client_t;

/* Run 'n' clients until *phase reaches 2 (0: warm-up, not counted; 1:
 * measured), then keep answering phase-two requests for 300 ms and close.
 * 'token' is the registration secret.  Returns 0, or -1 when the loop could
 * not be set up (nothing ran). */
int bench_load_run(bench_client_t *clients, int n, const char *token, const atomic_int *phase);

#endif /* TC_BENCH_LOAD_H */
