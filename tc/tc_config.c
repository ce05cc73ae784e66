/*
 * tc_config.c - see tc_config.h.
 */
#include "tc_config.h"
#include "txp_xid.h"

#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <uv.h>

#include "tc_admin_cmd.h"
#include "tc_bus_auth.h"
#include "tc_creds.h"
#include "tc_log.h"

typedef enum { T_INT, T_I64, T_STR } key_type_t;

typedef struct {
  const char *section;
  const char *key;
  key_type_t type;
  size_t offset;
  size_t size; /* for T_STR */
  long long min, max;
  const char *help;
} key_desc_t;

#define INT_KEY(sec, k, field, lo, hi, h) \
  {sec, k, T_INT, offsetof(tc_config_t, field), 0, lo, hi, h}
#define I64_KEY(sec, k, field, lo, hi, h) \
  {sec, k, T_I64, offsetof(tc_config_t, field), 0, lo, hi, h}
#define STR_KEY(sec, k, field, h) \
  {sec, k, T_STR, offsetof(tc_config_t, field), sizeof(((tc_config_t *)0)->field), 0, 0, h}

static const key_desc_t keys[] = {
  INT_KEY("node", "id", node_id, 1, 1023, "node id, unique in the cluster"),
  STR_KEY("node", "advertise", advertise, "host:port that clients use (default: listen)"),
  STR_KEY("server", "listen", listen, "host:port to listen on (loopback by default)"),
  STR_KEY("server", "token", token,
          "legacy shared registration secret: its holders form one group of their own (empty: off)"),
  STR_KEY("server", "credentials_file", credentials_file,
          "file of \"application_id group secret\" lines, mode 0600: each application's own secret "
          "(reloaded on SIGHUP)"),
  INT_KEY("server", "max_connections", max_connections, 1, 100000, "connection limit"),
  INT_KEY("server", "max_connections_per_address", max_connections_per_address, 1, 100000,
          "connections one peer address may hold (a host running many service instances needs more)"),
  INT_KEY("server", "max_inflight", max_inflight, 1, 65536, "requests in flight per connection"),
  INT_KEY("server", "heartbeat_ms", heartbeat_ms, 100, 600000, "heartbeat interval"),
  INT_KEY("server", "max_frame", max_frame, 1024, 16 * 1024 * 1024, "largest frame body"),
  STR_KEY("store", "pg_url", pg_url, "PostgreSQL URL of the coordinator store"),
  INT_KEY("store", "pool_size", pool_size, 2, 64, "PostgreSQL connections"),
  INT_KEY("store", "writers", writers, 1, 16, "connections running group-commit batches"),
  INT_KEY("store", "relaxed_writers", relaxed_writers, 0, 4,
          "connections for begins, committed without waiting for the WAL flush; with any, one "
          "more carries phase-two records the same way (0: both wait like decisions)"),
  INT_KEY("store", "batch_max", batch_max, 1, 4096, "requests per store batch"),
  INT_KEY("store", "queue_max", queue_max, 16, 1000000, "requests waiting for a batch"),
  INT_KEY("store", "begin_hold_ms", begin_hold_ms, 0, 1000,
          "a begin is answered at once and stored with its global's first registration on this "
          "node if one comes within this time, else alone (0: stored before it is answered)"),
  INT_KEY("txn", "default_timeout_ms", default_timeout_ms, 100, 86400000, "global timeout"),
  INT_KEY("txn", "max_timeout_ms", max_timeout_ms, 100, 86400000, "largest timeout allowed"),
  INT_KEY("txn", "max_lock_keys", max_lock_keys, 1, 100000, "lock keys per branch"),
  INT_KEY("txn", "lock_wait_max_ms", lock_wait_max_ms, 0, 600000, "longest lock wait"),
  INT_KEY("recovery", "interval_ms", recovery_interval_ms, 50, 600000, "recovery job period"),
  INT_KEY("recovery", "retry_min_ms", retry_min_ms, 10, 600000, "first phase-2 retry delay"),
  INT_KEY("recovery", "retry_max_ms", retry_max_ms, 10, 3600000, "longest phase-2 retry delay"),
  INT_KEY("recovery", "history_days", history_days, 0, 3650, "days of finished history kept"),
  I64_KEY("recovery", "leader_lock_key", leader_lock_key, 1, INT64_MAX, "advisory lock key"),
  STR_KEY("cluster", "bus", cluster_bus,
          "nanomsg address the peer bus binds, e.g. tcp://127.0.0.1:7101 (empty: no bus)"),
  STR_KEY("cluster", "peers", cluster_peers,
          "other nodes' buses as id@address,... (more are found in node_table)"),
  INT_KEY("cluster", "heartbeat_ms", cluster_heartbeat_ms, 100, 60000,
          "node_table and bus heartbeat period"),
  INT_KEY("cluster", "leader_lease_ms", cluster_leader_lease_ms, 500, 600000,
          "a leader whose node wrote no heartbeat for this long is fenced"),
  INT_KEY("cluster", "forward_timeout_ms", cluster_forward_timeout_ms, 100, 600000,
          "phase two relayed through a peer: time to wait for its answer"),
  INT_KEY("cluster", "lock_recheck_ms", cluster_lock_recheck_ms, 0, 600000,
          "with a bus, lock waiters re-check the store this often (0: never)"),
  INT_KEY("cluster", "claim_wait_ms", cluster_claim_wait_ms, 0, 600000,
          "how long a starting node waits for its node id to be freed"),
  STR_KEY("cluster", "secret_file", cluster_secret_file,
          "file (mode 0600) with the cluster secret that signs bus messages: one key of 64 hex digits, "
          "or two during a rotation (first signs, both verify); required with a bus"),
  INT_KEY("cluster", "replay_window_ms", cluster_replay_window_ms, 1000, 600000,
          "bus messages stamped further than this from our clock are dropped (node clocks must agree)"),
  STR_KEY("admin", "socket", admin_socket, "admin Unix socket path (empty: none)"),
  STR_KEY("admin", "allow_uids", admin_allow_uids, "uids allowed on the admin socket besides tcd's own"),
  STR_KEY("admin", "allow_gids", admin_allow_gids, "gids allowed on the admin socket"),
  STR_KEY("admin", "socket_mode", admin_socket_mode, "octal file mode of the admin socket"),
  INT_KEY("admin", "max_request", admin_max_request, 64, 1024 * 1024, "longest admin request line"),
  INT_KEY("admin", "idle_ms", admin_idle_ms, 100, 86400000, "idle admin connections are closed"),
  STR_KEY("metrics", "listen", metrics_listen, "host:port for /metrics (empty: none)"),
  STR_KEY("log", "level", log_level, "error | warn | info | debug"),
  STR_KEY("log", "format", log_format, "json | text"),
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

void tc_config_defaults(tc_config_t *c) {
  memset(c, 0, sizeof(*c));
  c->node_id = 1;
  snprintf(c->listen, sizeof(c->listen), "127.0.0.1:8091");
  c->max_connections = 4096;
  c->max_connections_per_address = 512;
  c->max_inflight = 1024;
  c->heartbeat_ms = 5000;
  c->max_frame = 1024 * 1024;
  c->pool_size = 5;
  c->writers = 2;
  c->relaxed_writers = 1;
  c->batch_max = 256;
  c->queue_max = 65536;
  c->begin_hold_ms = 20;
  c->default_timeout_ms = 60000;
  c->max_timeout_ms = 600000;
  c->max_lock_keys = 1024;
  c->lock_wait_max_ms = 30000;
  c->recovery_interval_ms = 1000;
  c->retry_min_ms = 200;
  c->retry_max_ms = 30000;
  c->history_days = 7;
  c->leader_lock_key = 7420742001LL;
  c->cluster_heartbeat_ms = 1000;
  c->cluster_leader_lease_ms = 5000;
  c->cluster_forward_timeout_ms = 10000;
  c->cluster_lock_recheck_ms = 500;
  c->cluster_claim_wait_ms = 3000;
  c->cluster_replay_window_ms = 30000;
  snprintf(c->admin_socket_mode, sizeof(c->admin_socket_mode), "0600");
  c->admin_max_request = 4096;
  c->admin_idle_ms = 60000;
  snprintf(c->log_level, sizeof(c->log_level), "info");
  snprintf(c->log_format, sizeof(c->log_format), "json");
}

static const key_desc_t *find_key(const char *section, const char *key) {
  for (size_t i = 0; i < NKEYS; i++)
    if (strcasecmp(keys[i].section, section) == 0 && strcasecmp(keys[i].key, key) == 0)
      return &keys[i];
  return NULL;
}

static int set_value(tc_config_t *c, const key_desc_t *k, const char *value, char *err,
                     size_t errlen, const char *where) {
  void *slot = (char *)c + k->offset;
  if (k->type == T_STR) {
    if (strlen(value) >= k->size) {
      snprintf(err, errlen, "%s: value of \"%s.%s\" is too long (at most %zu bytes)", where,
               k->section, k->key, k->size - 1);
      return -1;
    }
    snprintf(slot, k->size, "%s", value);
    return 0;
  }
  char *end;
  errno = 0;
  long long v = strtoll(value, &end, 10);
  while (end && isspace((unsigned char)*end)) end++;
  if (errno || end == value || *end != '\0') {
    snprintf(err, errlen, "%s: value \"%s\" of \"%s.%s\" is not an integer", where, value,
             k->section, k->key);
    return -1;
  }
  if (v < k->min || v > k->max) {
    snprintf(err, errlen, "%s: value %lld of \"%s.%s\" is out of range [%lld, %lld]", where, v,
             k->section, k->key, k->min, k->max);
    return -1;
  }
  if (k->type == T_INT) *(int *)slot = (int)v;
  else *(int64_t *)slot = v;
  return 0;
}

int tc_config_set(tc_config_t *c, const char *section, const char *key, const char *value,
                  char *err, size_t errlen) {
  const key_desc_t *k = find_key(section, key);
  if (!k) {
    snprintf(err, errlen, "unknown setting \"%s.%s\"", section, key);
    return -1;
  }
  return set_value(c, k, value, err, errlen, "setting");
}

typedef struct {
  tc_config_t *c;
  const char *path;
  char *err;
  size_t errlen;
  int failed;
} ini_ctx_t;

static int on_ini_entry(void *user, const char *section, const char *name, const char *value) {
  ini_ctx_t *x = user;
  if (x->failed) return 0;
  const key_desc_t *k = find_key(section, name);
  char where[512];
  snprintf(where, sizeof(where), "%s", x->path);
  if (!k) {
    snprintf(x->err, x->errlen, "%s: unknown setting \"%s\" in section [%s]", x->path, name,
             section);
    x->failed = 1;
    return 0;
  }
  if (set_value(x->c, k, value, x->err, x->errlen, where) != 0) {
    x->failed = 1;
    return 0;
  }
  return 1;
}

int tc_config_load_file(tc_config_t *c, const char *path, char *err, size_t errlen) {
  ini_ctx_t x = {c, path, err, errlen, 0};
  int rc = ini_parse(path, on_ini_entry, &x);
  if (rc == -1) {
    snprintf(err, errlen, "could not open config file \"%s\": %s", path, strerror(errno));
    return -1;
  }
  if (rc == -2) {
    snprintf(err, errlen, "could not read config file \"%s\": out of memory", path);
    return -1;
  }
  if (rc > 0) {
    /* inih reports the first failing line; our handler wrote the reason. */
    char reason[512];
    snprintf(reason, sizeof(reason), "%s", x.failed ? err : "syntax error");
    snprintf(err, errlen, "%s (line %d)", reason, rc);
    return -1;
  }
  return 0;
}

extern char **environ;

/* Variables of the project's own scripts that look like settings but are
 * not (cluster/local/up exports them for clients). */
static const char *const env_not_settings[] = {"TC_ADMIN_SOCKETS", "TC_METRICS_URLS", NULL};

/* An environment variable TC_<SECTION>_<KEY> whose section is one of ours
 * but whose key is not: a typo (TC_SERVER_TOKN) that would otherwise be
 * ignored.  Others with the TC_ prefix (TC_NODES, TC_PG_URL: the clients'
 * settings from cluster/local/up) name no section and are left alone. */
static int check_env_names(char *err, size_t errlen) {
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "TC_", 3) != 0) continue;
    const char *eq = strchr(*e, '=');
    size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
    char name[128];
    if (n >= sizeof(name)) continue;
    memcpy(name, *e, n);
    name[n] = '\0';
    bool allowed = false;
    for (size_t k = 0; env_not_settings[k]; k++) allowed |= strcmp(name, env_not_settings[k]) == 0;
    if (allowed) continue;
    bool in_section = false, known = false;
    for (size_t i = 0; i < NKEYS && !known; i++) {
      char want[128];
      snprintf(want, sizeof(want), "TC_%s_%s", keys[i].section, keys[i].key);
      for (char *p = want; *p; p++) *p = (char)toupper((unsigned char)*p);
      known = strcmp(name, want) == 0;
      size_t sl = 3 + strlen(keys[i].section);
      in_section |= strncasecmp(name + 3, keys[i].section, strlen(keys[i].section)) == 0 && name[sl] == '_';
    }
    if (in_section && !known) {
      snprintf(err, errlen, "unknown setting in the environment: %s (settings are TC_<SECTION>_<KEY>; "
               "tcd --print-config lists them)", name);
      return -1;
    }
  }
  return 0;
}

int tc_config_load_env(tc_config_t *c, char *err, size_t errlen) {
  if (check_env_names(err, errlen) != 0) return -1;
  for (size_t i = 0; i < NKEYS; i++) {
    char name[128];
    snprintf(name, sizeof(name), "TC_%s_%s", keys[i].section, keys[i].key);
    for (char *p = name; *p; p++) *p = (char)toupper((unsigned char)*p);
    const char *v = getenv(name);
    if (v && set_value(c, &keys[i], v, err, errlen, name) != 0) return -1;
  }
  return 0;
}

int tc_config_split_addr(const char *addr, char *host, size_t hostlen, int *port) {
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr) return -1;
  size_t hl = (size_t)(colon - addr);
  if (hl >= hostlen) return -1;
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (*end || end == colon + 1 || p < 0 || p > 65535) return -1;
  memcpy(host, addr, hl);
  host[hl] = '\0';
  *port = (int)p;
  return 0;
}

int tc_config_listen_sockaddr(const char *host, int port, struct sockaddr_storage *ss) {
  char buf[64];
  if (!host || !*host || strcmp(host, "*") == 0) host = "0.0.0.0";
  else if (strcmp(host, "localhost") == 0) host = "127.0.0.1";
  size_t n = strlen(host);
  if (host[0] == '[' && n >= 2 && host[n - 1] == ']' && n - 2 < sizeof(buf)) {
    memcpy(buf, host + 1, n - 2);
    buf[n - 2] = '\0';
    host = buf;
  }
  memset(ss, 0, sizeof(*ss));
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0) return 0;
  if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0) return 0;
  return -1;
}

int tc_config_each_peer(const char *peers, int (*fn)(int, const char *, void *), void *arg, char *err,
                        size_t errlen) {
  char entry[TC_CONFIG_STR + 16];
  const char *p = peers;
  while (p && *p) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    while (n && isspace((unsigned char)*p)) p++, n--;
    while (n && isspace((unsigned char)p[n - 1])) n--;
    if (n >= sizeof(entry)) {
      snprintf(err, errlen, "cluster.peers entry \"%.40s...\" is too long", p);
      return -1;
    }
    memcpy(entry, p, n);
    entry[n] = '\0';
    char *at = strchr(entry, '@'), *end = NULL;
    long id = at ? strtol(entry, &end, 10) : 0;
    if (n && (!at || end != at || id < 1 || id > 1023 || !at[1] || !strstr(at + 1, "://"))) {
      snprintf(err, errlen,
               "invalid cluster.peers entry \"%s\": expected id@address, e.g. 2@tcp://127.0.0.1:7102", entry);
      return -1;
    }
    if (n && fn) {
      int rc = fn((int)id, at + 1, arg);
      if (rc != 0) return rc;
    }
    p = comma ? comma + 1 : NULL;
  }
  return 0;
}

/* A bus address that binds every interface: tcp://STAR:N (a "*" host), tcp://0.0.0.0:N,
 * tcp://[::]:N (nanomsg's "tcp://eth0;..." interface form is left alone). */
static bool bus_wildcard(const char *addr) {
  const char *h = strstr(addr, "://");
  if (!h || strncmp(addr, "tcp", 3) != 0) return false;
  h += 3;
  return strncmp(h, "*:", 2) == 0 || strncmp(h, "0.0.0.0:", 8) == 0 || strncmp(h, "[::]:", 5) == 0 ||
         strncmp(h, "[::0]:", 6) == 0;
}

static int validate_cluster(const tc_config_t *c, char *err, size_t errlen) {
  if (c->cluster_bus[0] && !strstr(c->cluster_bus, "://")) {
    snprintf(err, errlen, "invalid cluster.bus \"%s\": expected a nanomsg address such as tcp://127.0.0.1:7101",
             c->cluster_bus);
    return -1;
  }
  if (c->cluster_bus[0] && bus_wildcard(c->cluster_bus)) {
    snprintf(err, errlen,
             "cluster.bus \"%s\" binds every interface: give the address the other nodes reach this one at "
             "(e.g. tcp://10.0.0.5:7101, or tcp://127.0.0.1:7101 on one machine)",
             c->cluster_bus);
    return -1;
  }
  if (c->cluster_bus[0]) {
    /* Without the secret anyone who reaches the bus could fake phase-two
     * results: no bus without it (and it must be readable now). */
    if (!c->cluster_secret_file[0]) {
      snprintf(err, errlen,
               "cluster.bus is set but cluster.secret_file is not: the bus needs the cluster secret (a file of "
               "mode 0600 with a key of 64 hex digits, the same on every node; or TC_CLUSTER_SECRET_FILE)");
      return -1;
    }
    tc_bus_keys_t k;
    int rc = tc_bus_keys_load(c->cluster_secret_file, &k, err, errlen);
    tc_bus_keys_wipe(&k);
    if (rc != 0) return -1;
  }
  if (tc_config_each_peer(c->cluster_peers, NULL, NULL, err, errlen) != 0) return -1;
  if (c->cluster_leader_lease_ms < 3 * c->cluster_heartbeat_ms) {
    snprintf(err, errlen, "cluster.leader_lease_ms (%d) must be at least 3 x cluster.heartbeat_ms (%d)",
             c->cluster_leader_lease_ms, c->cluster_heartbeat_ms);
    return -1;
  }
  return 0;
}

int tc_config_store_writers(const tc_config_t *c) {
  return c->writers + c->relaxed_writers + (c->relaxed_writers > 0 ? 1 : 0);
}

int tc_config_validate(const tc_config_t *c, char *err, size_t errlen) {
  char host[256];
  int port;
  struct sockaddr_storage ss;
  if (tc_config_split_addr(c->listen, host, sizeof(host), &port) != 0) {
    snprintf(err, errlen, "invalid server.listen \"%s\": expected host:port", c->listen);
    return -1;
  }
  if (tc_config_listen_sockaddr(host, port, &ss) != 0) {
    snprintf(err, errlen, "invalid server.listen \"%s\": the host must be a numeric IP address (or localhost)",
             c->listen);
    return -1;
  }
  if (strlen(c->advertise) > TXP_XID_NODE_MAX || strlen(c->listen) > TXP_XID_NODE_MAX) {
    snprintf(err, errlen, "node.advertise and server.listen must be at most %d bytes: they go into every xid",
             TXP_XID_NODE_MAX);
    return -1;
  }
  if (c->advertise[0] && tc_config_split_addr(c->advertise, host, sizeof(host), &port) != 0) {
    snprintf(err, errlen, "invalid node.advertise \"%s\": expected host:port", c->advertise);
    return -1;
  }
  if (c->token[0] == '\0' && c->credentials_file[0] == '\0') {
    snprintf(err, errlen,
             "neither server.credentials_file nor server.token is set: clients could not register "
             "(set TC_SERVER_CREDENTIALS_FILE, or the legacy TC_SERVER_TOKEN)");
    return -1;
  }
  if (c->credentials_file[0]) {
    char why[512];
    tc_creds_t *cr = tc_creds_load(c->credentials_file, why, sizeof(why));
    if (!cr) {
      snprintf(err, errlen, "invalid server.credentials_file: %s", why);
      return -1;
    }
    tc_creds_free(cr);
  }
  if (c->pg_url[0] == '\0') {
    snprintf(err, errlen, "store.pg_url is empty: set the PostgreSQL URL (or TC_STORE_PG_URL)");
    return -1;
  }
  /* --print-config masks secrets; its output fed back must not become
   * the secret. */
  if (strcmp(c->token, TC_CONFIG_MASK) == 0) {
    snprintf(err, errlen, "server.token is \"%s\", the mask --print-config prints: set the real secret",
             TC_CONFIG_MASK);
    return -1;
  }
  if (strstr(c->pg_url, TC_CONFIG_MASK "@")) {
    snprintf(err, errlen, "store.pg_url carries \"%s\", the mask --print-config prints for its password: set the "
             "real URL", TC_CONFIG_MASK);
    return -1;
  }
  if (c->default_timeout_ms > c->max_timeout_ms) {
    snprintf(err, errlen, "txn.default_timeout_ms (%d) is above txn.max_timeout_ms (%d)",
             c->default_timeout_ms, c->max_timeout_ms);
    return -1;
  }
  if (c->retry_min_ms > c->retry_max_ms) {
    snprintf(err, errlen, "recovery.retry_min_ms (%d) is above recovery.retry_max_ms (%d)",
             c->retry_min_ms, c->retry_max_ms);
    return -1;
  }
  if (tc_config_store_writers(c) >= c->pool_size) {
    snprintf(err, errlen,
             "store.writers (%d) plus store.relaxed_writers (%d)%s must be below store.pool_size "
             "(%d): at least one connection is left for reads",
             c->writers, c->relaxed_writers,
             c->relaxed_writers > 0 ? " plus the clean-up writer (1)" : "", c->pool_size);
    return -1;
  }
  if (validate_cluster(c, err, errlen) != 0) return -1;
  if (tc_log_level_parse(c->log_level) < 0) {
    snprintf(err, errlen, "invalid log.level \"%s\": expected error, warn, info or debug",
             c->log_level);
    return -1;
  }
  if (strcmp(c->log_format, "json") != 0 && strcmp(c->log_format, "text") != 0) {
    snprintf(err, errlen, "invalid log.format \"%s\": expected json or text", c->log_format);
    return -1;
  }
  if (tc_adm_check_config(c->admin_socket, c->admin_allow_uids, c->admin_allow_gids, c->admin_socket_mode,
                          err, errlen) != 0)
    return -1;
  if (c->metrics_listen[0] &&
      tc_config_split_addr(c->metrics_listen, host, sizeof(host), &port) != 0) {
    snprintf(err, errlen, "invalid metrics.listen \"%s\": expected host:port", c->metrics_listen);
    return -1;
  }
  return 0;
}

void tc_config_dump(const tc_config_t *c, void *file) {
  FILE *f = file;
  const char *section = "";
  for (size_t i = 0; i < NKEYS; i++) {
    const key_desc_t *k = &keys[i];
    if (strcmp(section, k->section) != 0) {
      fprintf(f, "%s[%s]\n", i ? "\n" : "", k->section);
      section = k->section;
    }
    const void *slot = (const char *)c + k->offset;
    fprintf(f, "; %s\n", k->help);
    if (k->type == T_STR) {
      const char *v = slot;
      if (strcmp(k->key, "token") == 0 && v[0]) v = TC_CONFIG_MASK;
      if (strcmp(k->key, "pg_url") == 0 && strchr(v, '@')) {
        /* URLs may carry a password: show only what follows the '@'. */
        fprintf(f, "%s = " TC_CONFIG_MASK "@%s\n", k->key, strchr(v, '@') + 1);
        continue;
      }
      fprintf(f, "%s = %s\n", k->key, v);
    } else if (k->type == T_INT) {
      fprintf(f, "%s = %d\n", k->key, *(const int *)slot);
    } else {
      fprintf(f, "%s = %lld\n", k->key, (long long)*(const int64_t *)slot);
    }
  }
}
