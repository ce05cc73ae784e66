/*
 * tc_main.c - tcd, the coordinator daemon: options, config, signals, loop.
 *
 * NOTES
 *   Under systemd (Type=notify, packaging/tcd@.service) the node says
 *   READY=1 once its store is connected and its listener bound (the
 *   node's start callback), STOPPING=1 when it begins to stop, and, when
 *   the unit has WatchdogSec, WATCHDOG=1 every half of that period from a
 *   loop timer: the loop is what the watchdog watches, so a stuck loop is
 *   restarted, while a store outage (the loop still runs, requests fail
 *   and are retried) is not turned into a restart loop.  Without
 *   NOTIFY_SOCKET each sd_notify is a no-op.  The datagrams go to a local
 *   socket that systemd reads at once: no wait on the loop.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include <systemd/sd-daemon.h>

#include "tc_config.h"
#include "tc_log.h"
#include "txc_failpoint.h"
#include "txc_logfile.h"
#include "tc_node.h"
#include "txp_msg.h"


typedef struct {
  uv_loop_t *loop;
  tc_node_t *node;
  uv_signal_t sigterm, sigint, sighup;
  uv_timer_t watchdog; /* WATCHDOG=1 for systemd, when the unit asks for it */
  bool watchdog_on;
  const tc_config_t *cfg;
  int exit_code;
  bool stopping;
} daemon_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: tcd [options]\n"
          "\n"
          "The transaction coordinator daemon: serves global transactions for TMs and\n"
          "RMs, keeping every session, branch and lock in PostgreSQL.\n"
          "\n"
          "options:\n"
          "  -c, --config FILE     read settings from FILE (INI; see --print-config)\n"
          "  -s, --set SEC.KEY=VAL override one setting (repeatable)\n"
          "      --check-config    validate the settings and exit (0 when valid)\n"
          "      --print-config    print the effective settings as INI and exit\n"
          "  -h, --help            this text\n"
          "  -V, --version         print the version\n"
          "\n"
          "Settings apply in this order: defaults, the config file, environment\n"
          "variables TC_<SECTION>_<KEY> (e.g. TC_SERVER_TOKEN, TC_STORE_PG_URL), --set.\n"
          "SIGTERM or SIGINT stops the node cleanly; SIGHUP reopens the log file\n"
          "(stderr, when it is a file: logrotate's signal), reloads\n"
          "server.credentials_file and reads cluster.secret_file again (steps of a\n"
          "rotation), and changes nothing else.\n"
          "\n"
          "exit status: 0 clean stop, 64 usage error, 78 bad configuration,\n"
          "             69 store or listener unavailable at start-up.\n");
}

static void close_signals(daemon_t *d) {
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sigint, NULL);
  uv_close((uv_handle_t *)&d->sighup, NULL);
}

static void on_stopped(void *arg) {
  daemon_t *d = arg;
  d->node = NULL;
  close_signals(d);
}

static void begin_stop(daemon_t *d) {
  if (d->stopping) return;
  d->stopping = true;
  sd_notify(0, "STOPPING=1");
  if (d->watchdog_on) {
    uv_timer_stop(&d->watchdog);
    uv_close((uv_handle_t *)&d->watchdog, NULL);
    d->watchdog_on = false;
  }
  if (d->node) tc_node_stop(d->node, on_stopped, d);
  else close_signals(d);
}

static void on_signal(uv_signal_t *h, int signum) {
  daemon_t *d = h->data;
  tc_log_info("received %s: stopping", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  begin_stop(d);
}

/* SIGHUP (logrotate, or a terminal that went away, or a step of a
 * credential or cluster secret rotation): reopen the log file, reload
 * server.credentials_file, read cluster.secret_file again, never stop. */
static void on_sighup(uv_signal_t *h, int signum) {
  (void)signum;
  daemon_t *d = h->data;
  if (d->node) {
    char why[512];
    int cr = tc_node_reload_credentials(d->node, why, sizeof(why));
    if (cr == 0) tc_log_info("received SIGHUP: credentials reloaded: %s", why);
    else if (cr < 0) tc_log_warn("received SIGHUP: could not reload the credentials, keeping the old ones: %s", why);
  }
  int rc = txc_logfile_reopen();
  if (rc > 0)
    tc_log_info("received SIGHUP: log file reopened");
  else if (rc == 0)
    tc_log_info("received SIGHUP: the log goes to a pipe or terminal, nothing to reopen; not stopping");
  else
    tc_log_warn("received SIGHUP: could not reopen the log file: %s (still writing to the old one)",
                strerror(errno));
  char msg[512];
  if (d && d->node && !d->stopping) {
    if (tc_node_reload_secret(d->node, msg, sizeof(msg)) != 0)
      tc_log_warn("received SIGHUP: could not read the cluster secret again: %s (the bus keeps its keys)", msg);
    else if (msg[0])
      tc_log_info("received SIGHUP: cluster secret read again (%s; the bus signs with the first)", msg);
  }
}

static void on_watchdog(uv_timer_t *t) {
  (void)t;
  sd_notify(0, "WATCHDOG=1");
}

static void on_ready(tc_node_t *node, int status, const char *err, void *arg) {
  daemon_t *d = arg;
  if (status != 0) {
    tc_log_error("could not start: %s", err ? err : "unknown error");
    d->exit_code = EX_UNAVAILABLE;
    begin_stop(d);
    return;
  }
  if (d->stopping) return;
  sd_notifyf(0, "READY=1\nSTATUS=node %d serving on %s", d->cfg->node_id, d->cfg->listen);
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000) {
    uint64_t every_ms = usec / 2000; /* half the period, in ms */
    uv_timer_init(d->loop, &d->watchdog);
    uv_timer_start(&d->watchdog, on_watchdog, every_ms, every_ms);
    d->watchdog_on = true;
    on_watchdog(&d->watchdog);
  }
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
    {"config", required_argument, NULL, 'c'},
    {"set", required_argument, NULL, 's'},
    {"check-config", no_argument, NULL, 'C'},
    {"print-config", no_argument, NULL, 'P'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
  };
  tc_config_t cfg;
  char err[1024];
  const char *config_path = NULL;
  bool check_only = false, print_only = false;
  char *sets[64];
  int nsets = 0;

  tc_config_defaults(&cfg);
  int ch;
  while ((ch = getopt_long(argc, argv, "c:s:hV", opts, NULL)) != -1) {
    switch (ch) {
    case 'c': config_path = optarg; break;
    case 's':
      if (nsets == 64) {
        fprintf(stderr, "tcd: too many --set options\n");
        return EX_USAGE;
      }
      sets[nsets++] = optarg;
      break;
    case 'C': check_only = true; break;
    case 'P': print_only = true; break;
    case 'h': usage(stdout); return 0;
    case 'V':
      printf("tcd %s (protocol %d.%d%s)\n", TXC_VERSION, TXP_VERSION_MAJOR, TXP_VERSION_MINOR,
             txc_failpoint_compiled() ? ", failpoints" : "");
      return 0;
    default: usage(stderr); return EX_USAGE;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "tcd: unexpected argument \"%s\" (see --help)\n", argv[optind]);
    return EX_USAGE;
  }
  if (config_path && tc_config_load_file(&cfg, config_path, err, sizeof(err)) != 0) {
    fprintf(stderr, "tcd: %s\n", err);
    return EX_CONFIG;
  }
  if (tc_config_load_env(&cfg, err, sizeof(err)) != 0) {
    fprintf(stderr, "tcd: %s\n", err);
    return EX_CONFIG;
  }
  for (int i = 0; i < nsets; i++) {
    char *eq = strchr(sets[i], '='), *dot = strchr(sets[i], '.');
    if (!eq || !dot || dot > eq) {
      fprintf(stderr, "tcd: --set expects SECTION.KEY=VALUE, got \"%s\"\n", sets[i]);
      return EX_USAGE;
    }
    *eq = *dot = '\0';
    if (tc_config_set(&cfg, sets[i], dot + 1, eq + 1, err, sizeof(err)) != 0) {
      fprintf(stderr, "tcd: %s\n", err);
      return EX_CONFIG;
    }
  }
  if (print_only) {
    tc_config_dump(&cfg, stdout);
    return 0;
  }
  if (tc_config_validate(&cfg, err, sizeof(err)) != 0) {
    fprintf(stderr, "tcd: %s\n", err);
    return EX_CONFIG;
  }
  if (txc_failpoint_arm_env(err, sizeof(err)) != 0) {
    fprintf(stderr, "tcd: TX_FAILPOINTS: %s\n", err);
    return EX_CONFIG;
  }
  if (check_only) {
    printf("tcd: configuration is valid\n");
    return 0;
  }

  tc_log_level = tc_log_level_parse(cfg.log_level);
  tc_log_set_json(strcmp(cfg.log_format, "json") == 0);
  tc_log_set_node((unsigned)cfg.node_id);
  signal(SIGPIPE, SIG_IGN);
  txc_logfile_remember();

  daemon_t d = {.cfg = &cfg};
  d.loop = uv_default_loop();
  uv_signal_init(d.loop, &d.sigterm);
  uv_signal_init(d.loop, &d.sigint);
  uv_signal_init(d.loop, &d.sighup);
  d.sigterm.data = d.sigint.data = d.sighup.data = &d;
  uv_signal_start(&d.sigterm, on_signal, SIGTERM);
  uv_signal_start(&d.sigint, on_signal, SIGINT);
  uv_signal_start(&d.sighup, on_sighup, SIGHUP);

  d.node = tc_node_start(d.loop, &cfg, on_ready, &d);
  if (!d.node) {
    fprintf(stderr, "tcd: could not start: out of memory\n");
    return EX_OSERR;
  }
  uv_run(d.loop, UV_RUN_DEFAULT);
  int rc = uv_loop_close(d.loop);
  if (rc != 0) tc_log_warn("event loop closed with handles still open");
  tc_log_info("stopped");
  return d.exit_code;
}
