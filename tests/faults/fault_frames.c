/*
 * fault_frames.c - fault 6 of the fault suite: garbage, truncated,
 * duplicated and replayed protocol frames sent to every tcd node while a
 * sale runs.
 *
 * Usage: fault_frames --nodes H:P,H:P,... [--seed N] [--rounds N]
 *                     [--xid XID:STATUS]...
 *   per round and node:
 *     1. garbage bytes (random length, seeded) on a fresh connection;
 *     2. a registered TM sends a valid header then half its body, and goes;
 *     3. a begin with an idempotency key, the same begin again on the next
 *        node (must give the same xid), commit, then the commit replayed
 *        three times, a rollback replayed after it and a commit frame
 *        duplicated in one write (same request id): the status answered
 *        must stay Committed (9) every time;
 *     4. every --xid XID:STATUS (a finished xid of the sale and its final
 *        status from global_history) replayed as GlobalCommit and as
 *        GlobalRollback: the answer must not report another final status.
 *   Prints one line per problem, then "frames: sent N, problems M" and the
 *   xids of step 3 ("own-xid X") for the checker.  Exit 0 when no problem,
 *   1 otherwise, 2 usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "txc_secret.h"
#include "txclient.h"

#define MAX_NODES 16
#define MAX_XIDS 256

static unsigned long long rng_state;
static unsigned rnd(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (unsigned)(rng_state >> 33);
}

static int problems, sent;
static const char *token;

static void problem(const char *what, const char *a, const char *b, int n) {
  problems++;
  printf("PROBLEM: %s: %s %s %d\n", what, a, b, n);
  fflush(stdout);
}

static txc_t *tm(const char *host, int port) {
  char err[256];
  txc_t *c = txc_connect(host, port, 3000, err, sizeof err);
  if (!c) return NULL;
  if (txc_register(c, false, "fault-frames", "fault-frames", token, NULL) != 0) {
    txc_close(c);
    return NULL;
  }
  return c;
}

static void header(unsigned char *h, unsigned type, unsigned long long id, unsigned body_len) {
  h[0] = 0xDA;
  h[1] = 0xDA;
  h[2] = TXP_VERSION_MAJOR;
  h[3] = 0;
  h[4] = (unsigned char)(type >> 8);
  h[5] = (unsigned char)type;
  h[6] = h[7] = 0;
  for (int i = 0; i < 8; i++) h[8 + i] = (unsigned char)(id >> (56 - 8 * i));
  for (int i = 0; i < 4; i++) h[16 + i] = (unsigned char)(body_len >> (24 - 8 * i));
}

static bool final_status(int s) { return s == 9 || s == 11 || s == 12 || s == 10 || s == 13 || s == 14; }

int main(int argc, char **argv) {
  char *nodes = NULL;
  unsigned long long seed = 1;
  int rounds = 1;
  char *xids[MAX_XIDS];
  int nx = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--nodes") && i + 1 < argc) nodes = argv[++i];
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--xid") && i + 1 < argc) {
      if (nx < MAX_XIDS) xids[nx++] = argv[++i];
      else i++;
    } else {
      fprintf(stderr, "usage: fault_frames --nodes H:P,... [--seed N] [--rounds N] [--xid XID:STATUS]...\n");
      return 2;
    }
  }
  /* The secret of application fault-frames (common/txc_secret.h), from a
   * file: never on the command line. */
  static char secret[512];
  char why[512];
  if (nodes && txc_secret_for("fault-frames", secret, sizeof(secret), NULL, why, sizeof(why)) != 0) {
    fprintf(stderr, "fault_frames: no secret: %s\n", why);
    return 2;
  }
  token = secret;
  if (!nodes) {
    fprintf(stderr, "fault_frames: --nodes is required\n");
    return 2;
  }
  rng_state = seed ? seed : 1;
  char hosts[MAX_NODES][64];
  int ports[MAX_NODES], nn = 0;
  for (char *tok = strtok(nodes, ","); tok && nn < MAX_NODES; tok = strtok(NULL, ",")) {
    char *colon = strrchr(tok, ':');
    if (!colon) continue;
    snprintf(hosts[nn], sizeof hosts[nn], "%.*s", (int)(colon - tok), tok);
    ports[nn++] = atoi(colon + 1);
  }
  for (int r = 0; r < rounds; r++) {
    for (int n = 0; n < nn; n++) {
      char err[256];
      /* 1. garbage */
      txc_t *c = txc_connect(hosts[n], ports[n], 3000, err, sizeof err);
      if (c) {
        unsigned char g[512];
        size_t len = 1 + rnd() % sizeof g;
        for (size_t i = 0; i < len; i++) g[i] = (unsigned char)rnd();
        if (rnd() % 2) g[0] = g[1] = 0xDA; /* looks like a frame, sometimes */
        txc_send_raw(c, g, len);
        sent++;
        txc_wait_closed(c, 2000);
        txc_close(c);
      }
      /* 2. truncated frame after a good registration */
      c = tm(hosts[n], ports[n]);
      if (c) {
        unsigned char h[TXP_HEADER_SIZE + 32];
        header(h, TXP_MSG_GLOBAL_BEGIN, 99, 64);
        for (int i = 0; i < 32; i++) h[TXP_HEADER_SIZE + i] = (unsigned char)rnd();
        txc_send_raw(c, h, sizeof h);
        sent++;
        txc_close(c);
      }
      /* 3. own transaction, duplicated and replayed */
      c = tm(hosts[n], ports[n]);
      txc_t *c2 = tm(hosts[(n + 1) % nn], ports[(n + 1) % nn]);
      if (c && c2) {
        char idem[96], x1[TXP_MAX_XID_LEN + 1] = "", x2[TXP_MAX_XID_LEN + 1] = "";
        snprintf(idem, sizeof idem, "fault-frames-%llu-%d-%d-%d", seed, (int)getpid(), r, n);
        int rc1 = txc_begin(c, 30000, "fault-frames", idem, x1);
        int rc2 = txc_begin(c2, 30000, "fault-frames", idem, x2);
        sent += 2;
        if (rc1 == 0 && rc2 == 0 && strcmp(x1, x2) != 0)
          problem("one idempotency key gave two xids", x1, x2, 0);
        if (rc1 == 0) {
          printf("own-xid %s\n", x1);
          int st = 0;
          int rc = txc_commit(c, x1, &st);
          sent++;
          if (rc == 0 && st == 9) {
            for (int k = 0; k < 3; k++) {
              st = 0;
              rc = txc_commit(k % 2 ? c2 : c, x1, &st);
              sent++;
              if (rc == 0 && st != 9) problem("replayed commit of a committed xid answered another status", x1, "", st);
            }
            st = 0;
            rc = txc_rollback(c2, x1, &st);
            sent++;
            if (rc == 0 && st != 9 && st != 0) problem("rollback of a committed xid answered another status", x1, "", st);
            /* the same commit frame twice in one write */
            txp_msg_t req;
            txp_msg_init(&req, TXP_MSG_GLOBAL_COMMIT);
            txp_msg_set_str(&req, TXP_F_XID, x1);
            req.request_id = 4242;
            txp_buf_t out;
            txp_buf_init(&out, 0);
            txp_encode(&req, &out, 0);
            txp_encode(&req, &out, 0);
            txc_send_raw(c, out.data, out.len);
            txp_buf_free(&out);
            sent += 2;
            usleep(20000);
          } else if (rc == 0) {
            problem("commit of own xid answered status", x1, "", st);
          }
        }
      }
      if (c) txc_close(c);
      if (c2) txc_close(c2);
      /* 4. replayed phase-two requests of the sale's finished xids */
      c = tm(hosts[n], ports[n]);
      for (int i = 0; c && i < nx; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", xids[i]);
        char *colon = strrchr(buf, ':');
        if (!colon) continue;
        *colon = 0;
        int want = atoi(colon + 1);
        int st = 0;
        int rc = (rnd() % 2) ? txc_commit(c, buf, &st) : txc_rollback(c, buf, &st);
        sent++;
        if (rc == 0 && final_status(st) && st != want && !(want == 12 && st == 11) && !(want == 11 && st == 12))
          problem("replayed phase two of a finished xid answered another final status (xid, final, answered)", buf, colon + 1, st);
      }
      if (c) txc_close(c);
    }
  }
  printf("frames: sent %d, problems %d\n", sent, problems);
  return problems ? 1 : 0;
}
