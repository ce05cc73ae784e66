/*
 * tc_admin_cmd.h - the admin socket's command language: parsing one request
 * line into a command, and planning a repair from a session's stored state.
 *
 * NOTES
 *   Everything here is pure (no I/O, no loop, no allocation that outlives a
 *   call), so the unit tests feed it lines and states directly, and tcctl
 *   links the same parser to reject a bad command before it connects.
 *
 *   Grammar (one line; words separated by blanks; a word may be quoted with
 *   "..." and \" \\ escapes; command words and option names are
 *   case-insensitive):
 *     show globals [status=S[,S...]] [min_age=SECONDS] [name=N] [limit=N]
 *     show global XID
 *     show locks [xid=X] [key=K | prefix=P] [limit=N]
 *     show history [xid=X] [status=S[,S...]] [name=N] [since=T] [until=T] [limit=N]
 *     show nodes
 *     stats
 *     rollback XID | commit XID | stop-retry XID | resume-retry XID
 *     redrive XID | delete XID
 *     failpoint list | failpoint arm SPEC   (test builds: common/txc_failpoint.h)
 *     help
 *   A status is a name ("RollbackRetrying", any case) or its number.  A
 *   time T is either how long ago ("90", "90s", "15m", "2h", "7d") or a UTC
 *   date and time ("2026-12-03", "2026-12-03T15:04", "2026-12-03T15:04:05Z";
 *   a blank may stand for the T).
 *
 *   Repairs (tc_adm_plan_repair) follow proto/txp_status.h: a repair never
 *   moves a session across the commit/rollback families, every status
 *   change it plans is a legal edge of txp_global_transition_ok(), and the
 *   plan carries the branch statuses that must not exist when the
 *   compare-and-set runs (e.g. no PhaseTwoCommitted branch under a forced
 *   rollback), so that the check and the change are one SQL statement.
 */
#ifndef TC_ADMIN_CMD_H
#define TC_ADMIN_CMD_H

#include <stdbool.h>
#include <stddef.h>

#include "txc_failpoint.h"
#include "txp_lockkey.h"
#include "txp_msg.h"
#include "txp_status.h"

typedef enum tc_adm_kind {
  TC_ADM_NONE = 0,
  TC_ADM_SHOW_GLOBALS,
  TC_ADM_SHOW_GLOBAL,
  TC_ADM_SHOW_LOCKS,
  TC_ADM_SHOW_NODES,
  TC_ADM_STATS,
  TC_ADM_SHOW_HISTORY,
  TC_ADM_HELP,
  /* repairs */
  TC_ADM_ROLLBACK,
  TC_ADM_COMMIT,
  TC_ADM_STOP_RETRY,
  TC_ADM_RESUME_RETRY,
  TC_ADM_REDRIVE,
  TC_ADM_DELETE,
  /* fault injection (builds with TX_FAILPOINTS) */
  TC_ADM_FAILPOINT_LIST,
  TC_ADM_FAILPOINT_ARM,
  TC_ADM__KINDS
} tc_adm_kind_t;

#define TC_ADM_MAX_STATUSES 16
#define TC_ADM_DEFAULT_LIMIT 100
#define TC_ADM_MAX_LIMIT 10000
#define TC_ADM_MAX_AGE_S (10.0 * 365 * 86400)

/* A point in time of "show history": 'ago' seconds before now, or Unix time. */
typedef struct tc_adm_time {
  bool set;
  bool ago;
  double s;
} tc_adm_time_t;

typedef struct tc_adm_cmd {
  tc_adm_kind_t kind;
  char xid[TXP_MAX_XID_LEN + 1];        /* show global, repairs; show locks xid= */
  bool has_xid;
  int statuses[TC_ADM_MAX_STATUSES];    /* show globals status= */
  int nstatuses;
  double min_age_s;                     /* show globals min_age= */
  bool has_min_age;
  char name[TXP_MAX_NAME_LEN + 1];      /* show globals / history name= */
  bool has_name;
  char key[TXP_MAX_ROW_KEY_LEN + 1];    /* show locks key= or prefix= */
  bool has_key, has_prefix;
  int limit;                            /* show globals / locks / history */
  tc_adm_time_t since, until;           /* show history: ended in [since, until] */
  char spec[TXC_FAILPOINT_MAX_SPEC + 1]; /* failpoint arm */
} tc_adm_cmd_t;

/*
 * Parse one request line ('len' bytes, without its newline; a trailing
 * '\r' is ignored).  Returns 0 and fills 'out', or -1 with a message in
 * 'err' that names what was wrong (the unknown word, the bad value, the
 * missing argument).  A line of only blanks parses as TC_ADM_NONE.
 */
int tc_adm_parse(const char *line, size_t len, tc_adm_cmd_t *out, char *err, size_t errlen);

/* The command's name as the grammar spells it ("show globals", "stop-retry"). */
const char *tc_adm_kind_name(tc_adm_kind_t kind);
/* Whether 'kind' changes the store (and so is logged with the operator's uid). */
bool tc_adm_is_repair(tc_adm_kind_t kind);

/* Quote 'word' for a request line if it needs it (blanks, quotes,
 * backslashes, '=' in a bare word, or empty).  Returns the length written
 * (excluding the NUL), or -1 if 'cap' is too small. */
int tc_adm_quote(const char *word, char *out, size_t cap);

/* Parse a time of "show history" (see the grammar).  0, or -1 with 'err'. */
int tc_adm_parse_time(const char *v, tc_adm_time_t *out, char *err, size_t errlen);
/* That time as Unix time, 'now' being the current Unix time. */
double tc_adm_time_unix(const tc_adm_time_t *t, double now);

/* ---- repairs ---- */

typedef enum tc_adm_action {
  TC_ADM_ACT_DECIDE,    /* from Begin: the store's own decision (commit or rollback) */
  TC_ADM_ACT_CAS,       /* compare-and-set the global status, nothing else */
  TC_ADM_ACT_CAS_DRIVE, /* compare-and-set (may keep the status), then drive phase two now */
} tc_adm_action_t;

/* What happens to next_retry_at with the compare-and-set. */
typedef enum tc_adm_retry {
  TC_ADM_RETRY_LEASE, /* this node drives now: keep the recovery job away for a lease */
  TC_ADM_RETRY_NOW,   /* due at once: the leader's retry job picks it up */
  TC_ADM_RETRY_CLEAR, /* no retry scheduled */
} tc_adm_retry_t;

#define TC_ADM_MAX_FORBID 4

typedef struct tc_adm_plan {
  tc_adm_action_t action;
  int from, to;         /* stored status expected, status set (may equal 'from') */
  bool commit;          /* DECIDE: commit, else rollback */
  tc_adm_retry_t retry;
  int forbid[TC_ADM_MAX_FORBID]; /* branch statuses that refuse the change */
  int nforbid;
} tc_adm_plan_t;

/*
 * Plan repair 'kind' (rollback, commit, stop-retry, resume-retry, redrive)
 * of global transaction 'xid' whose stored status is 'status' and whose
 * branches have 'branch_status[0..nbranches)'.  Returns 0 with 'plan', or
 * -1 with the reason it is refused in 'err' (e.g. a forced rollback of a
 * transaction whose decision was commit).  'delete' is not planned here:
 * it only ever touches sessions that are no longer live.
 */
int tc_adm_plan_repair(tc_adm_kind_t kind, const char *xid, int status, const int *branch_status,
                       int nbranches, tc_adm_plan_t *plan, char *err, size_t errlen);

/* ---- configuration helpers ---- */

#define TC_ADM_MAX_IDS 64

/* Parse a list of ids ("0, 1000 1001"; commas and/or blanks) into
 * 'ids[0..*n)'.  Empty is an empty list.  -1 with 'err' on a bad entry. */
int tc_adm_parse_ids(const char *list, unsigned *ids, int max, int *n, char *err, size_t errlen);
/* Parse an octal file mode ("0600", "660"); -1 unless within 0..0777. */
int tc_adm_parse_mode(const char *s, unsigned *mode);
/* Check the admin.* settings without binding anything (tcd start-up and
 * --check-config): a socket path that names a file and fits sun_path, id
 * lists, an octal mode.  0, or -1 with 'err' naming the setting. */
int tc_adm_check_config(const char *socket_path, const char *allow_uids, const char *allow_gids,
                        const char *socket_mode, char *err, size_t errlen);

#endif /* TC_ADMIN_CMD_H */
