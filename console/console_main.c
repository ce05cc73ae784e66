/*
 * console_main.c - txc-console: the read-only web console of a txc
 * cluster and its flash sale (issue 29; man/txc-console.1).
 *
 * NOTES
 *   txc-console --token-file F [--listen 127.0.0.1:8088] [--tc-pg URL]
 *               [--stock-pg URL] [--orders-pg URL] [--order-metrics URLS]
 *   Each URL defaults to the environment cluster/local/up and
 *   examples/services export (TC_PG_URL, STOCK_PG_URL, ORDERS_PG_URL,
 *   ORDER_URL + "/metrics").  The token file holds the credential (its
 *   first line; mode 0600, txc_secret.h); a file that does not exist yet
 *   is created with a random token.  Once listening it prints
 *   "export CONSOLE_URL=http://host:port" on stdout, and stops on
 *   SIGTERM or SIGINT.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "console_db.h"
#include "console_http.h"
#include "console_log.h"
#include "console_sampler.h"
#include "txc_secret.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: txc-console --token-file FILE [--listen HOST:PORT] [--tc-pg URL] [--stock-pg URL]\n"
          "                   [--orders-pg URL] [--order-metrics URL[,URL...]]\n"
          "  --token-file FILE    the credential (created with a random token if missing, mode 0600)\n"
          "  --listen HOST:PORT   where to serve (default 127.0.0.1:8088; port 0 picks a free one)\n"
          "  --tc-pg URL          the coordinator's store (default $TC_PG_URL)\n"
          "  --stock-pg URL       the stock database (default $STOCK_PG_URL; the sale pages)\n"
          "  --orders-pg URL      the orders database (default $ORDERS_PG_URL)\n"
          "  --order-metrics URLS the order-service's /metrics (default $ORDER_URL/metrics)\n");
}

/* A new random token in 'path' (never over an existing file). */
static int create_token(const char *path, char *err, size_t errlen) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(err, errlen, "cannot create token file %s: %s", path, strerror(errno));
    return -1;
  }
  unsigned char raw[24];
  char hex[sizeof(raw) * 2 + 2];
  randombytes_buf(raw, sizeof(raw));
  sodium_bin2hex(hex, sizeof(hex) - 1, raw, sizeof(raw));
  strcat(hex, "\n");
  ssize_t n = write(fd, hex, strlen(hex));
  close(fd);
  if (n != (ssize_t)strlen(hex)) {
    snprintf(err, errlen, "cannot write token file %s", path);
    unlink(path);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *listen = "127.0.0.1:8088", *token_file = NULL, *tc_url = getenv("TC_PG_URL"),
             *stock_url = getenv("STOCK_PG_URL"), *orders_url = getenv("ORDERS_PG_URL"), *metrics = NULL;
  char metrics_default[512];
  const char *order_url = getenv("ORDER_URL");
  if (order_url && *order_url && strlen(order_url) < sizeof(metrics_default) - 16) {
    snprintf(metrics_default, sizeof(metrics_default), "%s/metrics", order_url);
    metrics = metrics_default;
  }
  static const struct option opts[] = {{"listen", required_argument, 0, 'l'},    {"token-file", required_argument, 0, 't'},
                                       {"tc-pg", required_argument, 0, 'c'},     {"stock-pg", required_argument, 0, 's'},
                                       {"orders-pg", required_argument, 0, 'o'}, {"order-metrics", required_argument, 0, 'm'},
                                       {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'l': listen = optarg; break;
    case 't': token_file = optarg; break;
    case 'c': tc_url = optarg; break;
    case 's': stock_url = optarg; break;
    case 'o': orders_url = optarg; break;
    case 'm': metrics = optarg; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc || !token_file || !tc_url || !*tc_url) {
    fprintf(stderr, "txc-console: %s\n",
            optind < argc ? "unexpected arguments" : !token_file ? "--token-file is required" : "no --tc-pg and no TC_PG_URL");
    usage(stderr);
    return 2;
  }
  if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
    fprintf(stderr, "txc-console: cannot initialise libsodium or libcurl\n");
    return 1;
  }
  char err[512], token[CONSOLE_TOKEN_MAX];
  if (access(token_file, F_OK) != 0 && errno == ENOENT) {
    if (create_token(token_file, err, sizeof(err)) != 0) {
      console_log("error", "%s", err);
      return 1;
    }
    console_log("info", "created token file %s", token_file);
  }
  if (txc_secret_read(token_file, token, sizeof(token), err, sizeof(err)) != 0) {
    console_log("error", "token: %s (a file of mode 0600 with the token on its first line)", err);
    return 1;
  }
  /* Block the stop signals before any thread starts: they all inherit
   * the mask, and only sigwait below takes them. */
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);
  signal(SIGPIPE, SIG_IGN);

  console_db_t *tc = console_db_new("tc store", tc_url, CONSOLE_HTTP_THREADS);
  console_db_t *stock = stock_url && *stock_url ? console_db_new("stock database", stock_url, CONSOLE_HTTP_THREADS + 1) : NULL;
  console_db_t *orders = orders_url && *orders_url ? console_db_new("orders database", orders_url, CONSOLE_HTTP_THREADS) : NULL;
  console_sampler_t *sampler = tc ? console_sampler_start(stock, metrics, err, sizeof(err)) : NULL;
  if (!tc || !sampler) {
    console_log("error", "cannot start: %s", tc ? err : "out of memory");
    return 1;
  }
  console_http_cfg_t cfg = {.listen = listen, .token = token, .tc = tc, .stock = stock, .orders = orders,
                            .sampler = sampler};
  console_http_t *http = console_http_start(&cfg, err, sizeof(err));
  if (!http) {
    console_log("error", "%s", err);
    return 1;
  }
  char host[256];
  snprintf(host, sizeof(host), "%.*s", (int)(strrchr(listen, ':') - listen), listen);
  console_log("info", "console on http://%s:%d/ (log in at /login with the token in %s); sale pages %s, sampling %s",
              host, console_http_port(http), token_file, stock ? "on" : "off (no stock database)",
              metrics ? metrics : "no order-service");
  printf("export CONSOLE_URL=http://%s:%d\n", host, console_http_port(http));
  fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  console_log("info", "stopping (signal %d)", sig);
  console_http_stop(http);
  console_sampler_stop(sampler);
  console_db_free(orders);
  console_db_free(stock);
  console_db_free(tc);
  sodium_memzero(token, sizeof(token));
  curl_global_cleanup();
  return 0;
}
