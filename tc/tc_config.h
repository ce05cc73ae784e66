/*
 * tc_config.h - tcd settings: defaults, then an INI file, then environment
 * overrides (TC_<SECTION>_<KEY>, e.g. TC_SERVER_LISTEN), then the command line.
 *
 * NOTES
 *   Every key is declared once in a table in tc_config.c with its type and
 *   bounds; the parser, the env overrides, --check-config and the --help text
 *   all read that table.  Unknown sections or keys and out-of-range values
 *   are errors that name the file, line and key: a typo must not silently run
 *   a coordinator with a default.
 */
#ifndef TC_CONFIG_H
#define TC_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define TC_CONFIG_STR 256

typedef struct tc_config {
  /* [node] */
  int node_id;                      /* 1..1023, unique in the cluster */
  char advertise[TC_CONFIG_STR];    /* host:port clients use; default = listen */
  /* [server] */
  char listen[TC_CONFIG_STR];       /* host:port, default 127.0.0.1:8091 */
  char token[TC_CONFIG_STR];        /* legacy shared registration secret; may be empty */
  char credentials_file[TC_CONFIG_STR]; /* per-application secrets (tc_creds.h); may be empty */
  int max_connections;
  int max_connections_per_address;
  int max_inflight;                 /* per connection */
  int heartbeat_ms;                 /* peers idle 3x this are dropped */
  int max_frame;                    /* bytes of msgpack body */
  /* [store] */
  char pg_url[1024];
  int pool_size;
  int writers;                      /* connections that run group-commit batches */
  int relaxed_writers;              /* batches that need no WAL flush wait (tc_store.c) */
  int batch_max;                    /* requests per batch */
  int queue_max;                    /* requests waiting for a batch */
  int begin_hold_ms;                /* a begin waits this long for its first registration (tc_hold.h) */
  /* [txn] */
  int default_timeout_ms;
  int max_timeout_ms;
  int max_lock_keys;                /* keys per branch registration */
  int lock_wait_max_ms;
  /* [recovery] */
  int recovery_interval_ms;
  int retry_min_ms;
  int retry_max_ms;
  int history_days;
  int64_t leader_lock_key;
  /* [cluster] */
  char cluster_bus[TC_CONFIG_STR];  /* nanomsg address of this node's bus; empty: no bus */
  char cluster_peers[1024];         /* "id@address,..." of the other nodes' buses */
  int cluster_heartbeat_ms;         /* node_table and bus heartbeats */
  int cluster_leader_lease_ms;      /* a leader silent this long is fenced */
  int cluster_forward_timeout_ms;   /* phase two relayed through a peer */
  int cluster_lock_recheck_ms;      /* lock waiters re-check the store (bus mode) */
  int cluster_claim_wait_ms;        /* wait for a dead predecessor's node id */
  char cluster_secret_file[TC_CONFIG_STR]; /* the bus's shared key(s), mode 0600 (tc_bus_auth.h) */
  int cluster_replay_window_ms;     /* bus messages stamped further from our clock are dropped */
  /* [admin] */
  char admin_socket[TC_CONFIG_STR];
  char admin_allow_uids[TC_CONFIG_STR]; /* besides tcd's own uid; "0,1000" */
  char admin_allow_gids[TC_CONFIG_STR];
  char admin_socket_mode[8];        /* octal, default 0600 */
  int admin_max_request;            /* bytes of one request line */
  int admin_idle_ms;                /* idle admin connections are closed */
  /* [metrics] */
  char metrics_listen[TC_CONFIG_STR];
  /* [log] */
  char log_level[16];
  char log_format[16];              /* json | text */
} tc_config_t;

void tc_config_defaults(tc_config_t *c);

/* Load 'path' over the current values.  On error returns -1 and writes a
 * message naming the file/line/key to 'err'. */
int tc_config_load_file(tc_config_t *c, const char *path, char *err, size_t errlen);

/* Apply TC_<SECTION>_<KEY> environment variables. */
int tc_config_load_env(tc_config_t *c, char *err, size_t errlen);

/* Set one "section.key" (command-line --set section.key=value). */
int tc_config_set(tc_config_t *c, const char *section, const char *key, const char *value,
                  char *err, size_t errlen);

/* Connections the store writes on: store.writers, store.relaxed_writers and,
 * with a relaxed lane, one for phase-two records (tc_store.c NOTES). */
int tc_config_store_writers(const tc_config_t *c);

/* Cross-field checks (required values, min <= max, parseable addresses). */
int tc_config_validate(const tc_config_t *c, char *err, size_t errlen);

/* Print every key with its current value (token masked) as INI. */
void tc_config_dump(const tc_config_t *c, void *file /* FILE* */);

/* Call 'fn' for each "id@address" entry of cluster.peers (in order).
 * Returns 0, -1 with 'err' set when an entry is malformed, or what 'fn'
 * returned when it was not 0. */
int tc_config_each_peer(const char *peers, int (*fn)(int node_id, const char *addr, void *arg), void *arg,
                        char *err, size_t errlen);

/* Split "host:port"; returns -1 if malformed. */
/* What --print-config prints in place of a secret. */
#define TC_CONFIG_MASK "********"

int tc_config_split_addr(const char *addr, char *host, size_t hostlen, int *port);

/* The socket address of a listen host (numeric IPv4 or IPv6, "[v6]",
 * "localhost", "" or "*" for every address) and port: 0, or -1 when the
 * host is not numeric.  What start-up binds is what --check-config checks. */
struct sockaddr_storage;
int tc_config_listen_sockaddr(const char *host, int port, struct sockaddr_storage *ss);

#endif /* TC_CONFIG_H */
