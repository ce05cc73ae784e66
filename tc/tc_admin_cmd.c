/*
 * tc_admin_cmd.c - parsing admin request lines and planning repairs; see
 * tc_admin_cmd.h.
 *
 * NOTES
 *   The parser is strict on purpose: an operator who mistypes an option
 *   must get an error naming it, never a command that silently ignores the
 *   filter (a "show globals stauts=RollbackFailed" that lists everything is
 *   worse than an error).  Repairs take exactly one XID and nothing else.
 *   Bytes that are not printable UTF-8 are refused before any word is
 *   looked at, so every string that reaches a JSON answer or a log line is
 *   valid text.
 */
#include "tc_admin_cmd.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_WORDS 16
#define MAX_WORD 4096

typedef struct {
  char *w[MAX_WORDS];
  int n;
  char store[MAX_WORD * 2];
  size_t used;
} words_t;

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* Length of the UTF-8 sequence at 's' (at most 'n' bytes), 0 if invalid.
 * Overlong forms, surrogates and code points past U+10FFFF are invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len;
  unsigned cp;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
  else return 0;
  if (len > n) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if (cp >= 0xd800 && cp <= 0xdfff) return 0;
  return len;
}

/* Split 'line' into words (see the grammar in the header). */
static int split_words(const char *line, size_t len, words_t *ws, char *err, size_t errlen) {
  ws->n = 0;
  ws->used = 0;
  size_t i = 0;
  for (size_t k = 0; k < len;) {
    unsigned char c = (unsigned char)line[k];
    if (c == '\t') {
      k++;
      continue;
    }
    if (c < 0x20 || c == 0x7f)
      return fail(err, errlen, "request contains a control character (byte 0x%02x at offset %zu)", c, k);
    size_t l = utf8_len((const unsigned char *)line + k, len - k);
    if (l == 0) return fail(err, errlen, "request is not valid UTF-8 (at offset %zu)", k);
    k += l;
  }
  while (i < len) {
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    if (i >= len) break;
    if (ws->n == MAX_WORDS) return fail(err, errlen, "too many words in the request (at most %d)", MAX_WORDS);
    char *out = ws->store + ws->used;
    size_t o = 0, room = sizeof(ws->store) - ws->used - 1;
    bool quoted = false;
    while (i < len) {
      char c = line[i];
      if (!quoted && (c == ' ' || c == '\t')) break;
      if (c == '"') {
        quoted = !quoted;
        i++;
        continue;
      }
      if (c == '\\' && quoted) {
        if (i + 1 >= len) break;
        c = line[++i];
        if (c != '"' && c != '\\')
          return fail(err, errlen, "unknown escape \"\\%c\" in a quoted word: only \\\" and \\\\ are allowed", c);
      }
      if (o >= room || o >= MAX_WORD) return fail(err, errlen, "word too long (at most %d bytes)", MAX_WORD);
      out[o++] = c;
      i++;
    }
    if (quoted) return fail(err, errlen, "unterminated quoted word");
    out[o] = '\0';
    ws->w[ws->n++] = out;
    ws->used += o + 1;
  }
  return 0;
}

/* ------------------------------------------------------------- commands */

static const char *const kind_names[TC_ADM__KINDS] = {
  [TC_ADM_NONE] = "",
  [TC_ADM_SHOW_GLOBALS] = "show globals",
  [TC_ADM_SHOW_GLOBAL] = "show global",
  [TC_ADM_SHOW_LOCKS] = "show locks",
  [TC_ADM_SHOW_NODES] = "show nodes",
  [TC_ADM_STATS] = "stats",
  [TC_ADM_SHOW_HISTORY] = "show history",
  [TC_ADM_HELP] = "help",
  [TC_ADM_ROLLBACK] = "rollback",
  [TC_ADM_COMMIT] = "commit",
  [TC_ADM_STOP_RETRY] = "stop-retry",
  [TC_ADM_RESUME_RETRY] = "resume-retry",
  [TC_ADM_REDRIVE] = "redrive",
  [TC_ADM_DELETE] = "delete",
  [TC_ADM_FAILPOINT_LIST] = "failpoint list",
  [TC_ADM_FAILPOINT_ARM] = "failpoint arm",
};

const char *tc_adm_kind_name(tc_adm_kind_t kind) {
  return kind >= 0 && kind < TC_ADM__KINDS ? kind_names[kind] : "?";
}

bool tc_adm_is_repair(tc_adm_kind_t kind) { return kind >= TC_ADM_ROLLBACK && kind < TC_ADM__KINDS; }

static int set_xid(char *dst, const char *v, const char *what, char *err, size_t errlen) {
  size_t l = strlen(v);
  if (l == 0) return fail(err, errlen, "empty %s", what);
  if (l > TXP_MAX_XID_LEN)
    return fail(err, errlen, "%s is %zu bytes long: at most %d", what, l, TXP_MAX_XID_LEN);
  memcpy(dst, v, l + 1);
  return 0;
}

static int parse_limit(const char *v, int *out, char *err, size_t errlen) {
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno || end == v || *end || n < 1 || n > TC_ADM_MAX_LIMIT)
    return fail(err, errlen, "invalid value \"%.64s\" for \"limit\": expected an integer from 1 to %d", v,
                TC_ADM_MAX_LIMIT);
  *out = (int)n;
  return 0;
}

static int parse_statuses(const char *v, tc_adm_cmd_t *c, char *err, size_t errlen) {
  const char *p = v;
  if (!*p) return fail(err, errlen, "empty value for \"status\"");
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t l = comma ? (size_t)(comma - p) : strlen(p);
    char word[64];
    if (l == 0 || l >= sizeof(word))
      return fail(err, errlen, "invalid status list \"%.64s\": expected names or numbers separated by commas", v);
    memcpy(word, p, l);
    word[l] = '\0';
    int s = -1;
    if (isdigit((unsigned char)word[0])) {
      char *end;
      long n = strtol(word, &end, 10);
      if (!*end && txp_global_status_valid((int)n) && n < TXP_GS__MAX) s = (int)n;
    } else {
      s = txp_global_status_parse(word);
    }
    if (s < 0)
      return fail(err, errlen,
                  "unknown global status \"%s\": expected a name such as Begin, AsyncCommitting, "
                  "CommitRetrying, Rollbacking, RollbackRetrying, RollbackFailed, or its number",
                  word);
    if (c->nstatuses == TC_ADM_MAX_STATUSES)
      return fail(err, errlen, "too many statuses in \"status\" (at most %d)", TC_ADM_MAX_STATUSES);
    c->statuses[c->nstatuses++] = s;
    p += l;
    if (*p == ',') p++;
    if (comma && !*p) return fail(err, errlen, "invalid status list \"%.64s\": trailing comma", v);
  }
  return 0;
}

static int parse_age(const char *v, double *out, char *err, size_t errlen) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (errno || end == v || *end || !isfinite(d) || d < 0 || d > TC_ADM_MAX_AGE_S || !isdigit((unsigned char)v[0]))
    return fail(err, errlen, "invalid value \"%.64s\" for \"min_age\": expected seconds (a number >= 0)", v);
  *out = d;
  return 0;
}

/* Split "key=value"; -1 if there is no '='. */
static int split_option(char *w, char **key, char **val) {
  char *eq = strchr(w, '=');
  if (!eq || eq == w) return -1;
  *eq = '\0';
  *key = w;
  *val = eq + 1;
  return 0;
}

int tc_adm_parse_time(const char *v, tc_adm_time_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  size_t l = strlen(v);
  if (l == 0 || l > 32 || !isdigit((unsigned char)v[0]))
    return fail(err, errlen,
                "invalid time \"%.64s\": expected how long ago (90s, 15m, 2h, 7d) or a UTC time "
                "(2026-12-03T15:04:05Z)",
                v);
  /* How long ago: digits (a fraction allowed) and an optional unit. */
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  size_t digits = strspn(v, "0123456789.");
  if (!errno && end == v + digits && isfinite(d) && d >= 0 && (end[0] == '\0' || end[1] == '\0')) {
    double unit = 0;
    switch (end[0]) {
    case '\0':
    case 's': unit = 1; break;
    case 'm': unit = 60; break;
    case 'h': unit = 3600; break;
    case 'd': unit = 86400; break;
    default: break;
    }
    if (unit > 0) {
      if (d * unit > TC_ADM_MAX_AGE_S) return fail(err, errlen, "time \"%.64s\" is more than ten years ago", v);
      out->set = out->ago = true;
      out->s = d * unit;
      return 0;
    }
  }
  /* A UTC date, then optionally hours:minutes[:seconds], then optionally Z. */
  int y = 0, mo = 0, da = 0, h = 0, mi = 0, se = 0, n = 0;
  const char *p = v;
  if (sscanf(p, "%4d-%2d-%2d%n", &y, &mo, &da, &n) != 3 || n != 10) goto bad;
  p += n;
  if (*p == 'T' || *p == 't' || *p == ' ') {
    p++;
    n = 0;
    if (sscanf(p, "%2d:%2d%n", &h, &mi, &n) != 2 || n != 5) goto bad;
    p += n;
    if (*p == ':') {
      p++;
      n = 0;
      if (sscanf(p, "%2d%n", &se, &n) != 1 || n != 2) goto bad;
      p += n;
    }
  }
  if (*p == 'Z' || *p == 'z') p++;
  if (*p || y < 1970 || y > 9999 || mo < 1 || mo > 12 || da < 1 || da > 31 || h > 23 || mi > 59 || se > 60)
    goto bad;
  struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = da, .tm_hour = h, .tm_min = mi, .tm_sec = se};
  time_t t = timegm(&tm);
  if (t == (time_t)-1 || tm.tm_mday != da) goto bad; /* 2026-02-31 normalises to March */
  out->set = true;
  out->s = (double)t;
  return 0;
bad:
  return fail(err, errlen,
              "invalid time \"%.64s\": expected how long ago (90s, 15m, 2h, 7d) or a UTC time "
              "(YYYY-MM-DD[THH:MM[:SS]][Z])",
              v);
}

double tc_adm_time_unix(const tc_adm_time_t *t, double now) { return t->ago ? now - t->s : t->s; }

/*
 * The options of the show commands ("key=value" words).  Each is parsed
 * into the command the same way whichever command takes it; 'again' says
 * the same option came before in this command.
 */
typedef int (*option_fn)(const char *k, char *v, bool again, tc_adm_cmd_t *c, char *err, size_t errlen);

static int given_twice(const char *name, char *err, size_t errlen) {
  return fail(err, errlen, "option \"%s\" given twice", name);
}

static int opt_xid(const char *k, char *v, bool again, tc_adm_cmd_t *c, char *err, size_t errlen) {
  if (again) return given_twice("xid", err, errlen);
  if (set_xid(c->xid, v, "xid", err, errlen) != 0) return -1;
  c->has_xid = true;
  return 0;
}

static int opt_status(const char *k, char *v, bool again, tc_adm_cmd_t *c, char *err, size_t errlen) {
  if (again) return given_twice("status", err, errlen);
  return parse_statuses(v, c, err, errlen);
}

static int opt_min_age(const char *k, char *v, bool again, tc_adm_cmd_t *c, char *err, size_t errlen) {
  if (again) return given_twice("min_age", err, errlen);
  if (parse_age(v, &c->min_age_s, err, errlen) != 0) return -1;
  c->has_min_age = true;
  return 0;
}

static int opt_name(const char *k, char *v, bool again, tc_adm_cmd_t *c, char *err, size_t errlen) {
  if (again) return given_twice("name", err, errlen);
  size_t l = strlen(v);
  if (l == 0 || l > TXP_MAX_NAME_LEN)
    return fail(err, errlen, "invalid value for \"name\": expected 1 to %d bytes", TXP_MAX_NAME_LEN);
  memcpy(c->name, v, l + 1);
  c->has_name = true;
  return 0;
}

/* since= and until= */
static int opt_time(const char *k, char *v, bool again, tc_adm_cmd_t *c, char *err, size_t errlen) {
  if (again) return given_twice(k, err, errlen);
  return tc_adm_parse_time(v, strcasecmp(k, "since") == 0 ? &c->since : &c->until, err, errlen);
}

/* key= and prefix=: one of them, once. */
static int opt_key(const char *k, char *v, bool again, tc_adm_cmd_t *c, char *err, size_t errlen) {
  bool prefix = strcasecmp(k, "prefix") == 0;
  if (c->has_key || c->has_prefix) return fail(err, errlen, "give one of \"key\" and \"prefix\", once");
  size_t l = strlen(v);
  if (l == 0 || l > TXP_MAX_ROW_KEY_LEN)
    return fail(err, errlen, "invalid value for \"%s\": expected 1 to %d bytes", prefix ? "prefix" : "key",
                TXP_MAX_ROW_KEY_LEN);
  memcpy(c->key, v, l + 1);
  if (prefix) c->has_prefix = true;
  else c->has_key = true;
  return 0;
}

static int opt_limit(const char *k, char *v, bool again, tc_adm_cmd_t *c, char *err, size_t errlen) {
  if (again) return given_twice("limit", err, errlen);
  return parse_limit(v, &c->limit, err, errlen);
}

typedef struct {
  const char *name;
  option_fn parse;
} option_t;

#define MAX_OPTIONS 6

/* A show command's name and its options, in the order its errors list them. */
typedef struct {
  const char *cmd;
  option_t opt[MAX_OPTIONS];
  int n;
} options_t;

static const options_t show_globals_options = {
  "show globals", {{"status", opt_status}, {"min_age", opt_min_age}, {"name", opt_name}, {"limit", opt_limit}}, 4};
static const options_t show_history_options = {"show history",
                                               {{"xid", opt_xid},
                                                {"status", opt_status},
                                                {"name", opt_name},
                                                {"since", opt_time},
                                                {"until", opt_time},
                                                {"limit", opt_limit}},
                                               6};
static const options_t show_locks_options = {
  "show locks", {{"xid", opt_xid}, {"key", opt_key}, {"prefix", opt_key}, {"limit", opt_limit}}, 4};

/* The option names as an error lists them, each followed by 'suffix':
 * "a=, b= or c=". */
static const char *option_list(const options_t *o, const char *suffix, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < o->n && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s%s", i == 0 ? "" : i == o->n - 1 ? " or " : ", ", o->opt[i].name,
                          suffix);
  return buf;
}

/* The options from word 'first' on, for the show command 'o'. */
static int parse_options(words_t *ws, int first, const options_t *o, tc_adm_cmd_t *c, char *err, size_t errlen) {
  bool seen[MAX_OPTIONS] = {false};
  char list[128];
  for (int i = first; i < ws->n; i++) {
    char *k, *v;
    if (split_option(ws->w[i], &k, &v) != 0)
      return fail(err, errlen, "unexpected argument \"%.64s\" for \"%s\": expected %s", ws->w[i], o->cmd,
                  option_list(o, "=", list, sizeof(list)));
    int j = 0;
    while (j < o->n && strcasecmp(k, o->opt[j].name) != 0) j++;
    if (j == o->n)
      return fail(err, errlen, "unknown option \"%.64s\" for \"%s\": expected %s", k, o->cmd,
                  option_list(o, "", list, sizeof(list)));
    if (o->opt[j].parse(k, v, seen[j], c, err, errlen) != 0) return -1;
    seen[j] = true;
  }
  return 0;
}

static int no_more(words_t *ws, int first, const char *cmd, char *err, size_t errlen) {
  if (ws->n > first)
    return fail(err, errlen, "unexpected argument \"%.64s\": \"%s\" takes no arguments", ws->w[first], cmd);
  return 0;
}

static int one_xid(words_t *ws, int first, tc_adm_cmd_t *c, char *err, size_t errlen) {
  const char *cmd = tc_adm_kind_name(c->kind);
  if (ws->n <= first) return fail(err, errlen, "missing XID: usage \"%s XID\"", cmd);
  if (ws->n > first + 1)
    return fail(err, errlen, "unexpected argument \"%.64s\": \"%s\" takes one XID", ws->w[first + 1], cmd);
  if (set_xid(c->xid, ws->w[first], "XID", err, errlen) != 0) return -1;
  c->has_xid = true;
  return 0;
}

int tc_adm_parse(const char *line, size_t len, tc_adm_cmd_t *c, char *err, size_t errlen) {
  memset(c, 0, sizeof(*c));
  c->limit = TC_ADM_DEFAULT_LIMIT;
  if (len > 0 && line[len - 1] == '\r') len--;
  words_t *ws = malloc(sizeof(*ws));
  if (!ws) return fail(err, errlen, "out of memory");
  int rc = split_words(line, len, ws, err, errlen);
  if (rc != 0 || ws->n == 0) goto out;
  const char *w0 = ws->w[0];
  if (strcasecmp(w0, "show") == 0) {
    if (ws->n < 2) {
      rc = fail(err, errlen, "missing object: usage \"show globals|global XID|locks|history|nodes\"");
      goto out;
    }
    const char *w1 = ws->w[1];
    if (strcasecmp(w1, "globals") == 0) {
      c->kind = TC_ADM_SHOW_GLOBALS;
      rc = parse_options(ws, 2, &show_globals_options, c, err, errlen);
    } else if (strcasecmp(w1, "global") == 0) {
      c->kind = TC_ADM_SHOW_GLOBAL;
      rc = one_xid(ws, 2, c, err, errlen);
    } else if (strcasecmp(w1, "locks") == 0) {
      c->kind = TC_ADM_SHOW_LOCKS;
      c->limit = 1000;
      rc = parse_options(ws, 2, &show_locks_options, c, err, errlen);
    } else if (strcasecmp(w1, "history") == 0) {
      c->kind = TC_ADM_SHOW_HISTORY;
      rc = parse_options(ws, 2, &show_history_options, c, err, errlen);
    } else if (strcasecmp(w1, "nodes") == 0) {
      c->kind = TC_ADM_SHOW_NODES;
      rc = no_more(ws, 2, "show nodes", err, errlen);
    } else {
      rc = fail(err, errlen, "unknown object \"%.64s\" for \"show\": expected globals, global, locks, history or nodes", w1);
    }
    goto out;
  }
  if (strcasecmp(w0, "stats") == 0) {
    c->kind = TC_ADM_STATS;
    rc = no_more(ws, 1, "stats", err, errlen);
    goto out;
  }
  if (strcasecmp(w0, "failpoint") == 0) {
    if (ws->n >= 2 && strcasecmp(ws->w[1], "list") == 0) {
      c->kind = TC_ADM_FAILPOINT_LIST;
      rc = no_more(ws, 2, "failpoint list", err, errlen);
    } else if (ws->n >= 2 && strcasecmp(ws->w[1], "arm") == 0) {
      c->kind = TC_ADM_FAILPOINT_ARM;
      if (ws->n != 3)
        rc = fail(err, errlen, "usage \"failpoint arm NAME=ACTION[@N][,...]\" (one word)");
      else if (strlen(ws->w[2]) > TXC_FAILPOINT_MAX_SPEC)
        rc = fail(err, errlen, "failpoint spec too long (at most %d bytes)", TXC_FAILPOINT_MAX_SPEC);
      else if ((rc = txc_failpoint_check(ws->w[2], err, errlen)) == 0)
        snprintf(c->spec, sizeof(c->spec), "%s", ws->w[2]);
    } else {
      rc = fail(err, errlen, "usage \"failpoint list\" or \"failpoint arm NAME=ACTION[@N][,...]\"");
    }
    goto out;
  }
  if (strcasecmp(w0, "help") == 0) {
    c->kind = TC_ADM_HELP;
    rc = no_more(ws, 1, "help", err, errlen);
    goto out;
  }
  /* A repair's word is its kind's name: "rollback XID", ... "delete XID". */
  for (int k = TC_ADM_ROLLBACK; k <= TC_ADM_DELETE; k++) {
    if (strcasecmp(w0, kind_names[k]) == 0) {
      c->kind = (tc_adm_kind_t)k;
      rc = one_xid(ws, 1, c, err, errlen);
      goto out;
    }
  }
  rc = fail(err, errlen,
            "unknown command \"%.64s\": expected show, stats, rollback, commit, stop-retry, resume-retry, "
            "redrive, delete, failpoint or help",
            w0);
out:
  free(ws);
  if (rc != 0) {
    memset(c, 0, sizeof(*c));
    return -1;
  }
  return 0;
}

int tc_adm_quote(const char *word, char *out, size_t cap) {
  bool need = word[0] == '\0';
  for (const char *p = word; *p && !need; p++)
    need = *p == ' ' || *p == '\t' || *p == '"' || *p == '\\';
  size_t o = 0;
  if (!need) {
    size_t l = strlen(word);
    if (l + 1 > cap) return -1;
    memcpy(out, word, l + 1);
    return (int)l;
  }
  if (cap < 3) return -1;
  out[o++] = '"';
  for (const char *p = word; *p; p++) {
    if (o + 4 > cap) return -1;
    if (*p == '"' || *p == '\\') out[o++] = '\\';
    out[o++] = *p;
  }
  out[o++] = '"';
  out[o] = '\0';
  return (int)o;
}

/* -------------------------------------------------------------- repairs */

static bool is_phase2(int s) { return s >= TXP_GS_COMMITTING && s <= TXP_GS_ASYNC_COMMITTING; }

/* The status a re-drive moves a session to: failed or stopped sessions go
 * back to their family's retrying status (the operator re-drive edges of
 * txp_status.c); sessions mid-phase-two keep theirs. */
static int redrive_target(int s) {
  switch (s) {
  case TXP_GS_COMMIT_FAILED:
  case TXP_GS_STOP_COMMIT_RETRY: return TXP_GS_COMMIT_RETRYING;
  case TXP_GS_ROLLBACK_FAILED:
  case TXP_GS_STOP_ROLLBACK_RETRY: return TXP_GS_ROLLBACK_RETRYING;
  case TXP_GS_TIMEOUT_ROLLBACK_FAILED: return TXP_GS_TIMEOUT_ROLLBACK_RETRYING;
  default: return is_phase2(s) ? s : -1;
  }
}

static int first_branch_in(const int *bs, int n, const int *set, int nset) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < nset; k++)
      if (bs[i] == set[k]) return i;
  return -1;
}

static void add_forbid(tc_adm_plan_t *p, int s) {
  if (p->nforbid < TC_ADM_MAX_FORBID) p->forbid[p->nforbid++] = s;
}

/* The two forced decisions are mirror images: what each is called, the
 * statuses that drive it already, where a Begin global goes, and the
 * branch statuses that must not be found (a branch that went the other
 * way). */
typedef struct force_dir {
  bool commit;
  const char *verb, *verbing, *other; /* "roll back", "rolling back", "commit" */
  int driving[2];
  int begin_to;
  int forbid[3], nforbid;
} force_dir_t;

static const force_dir_t force_rollback = {
  .commit = false, .verb = "roll back", .verbing = "rolling back", .other = "commit",
  .driving = {TXP_GS_ROLLBACKING, TXP_GS_TIMEOUT_ROLLBACKING}, .begin_to = TXP_GS_ROLLBACKING,
  .forbid = {TXP_BS_PHASE2_COMMITTED}, .nforbid = 1};
static const force_dir_t force_commit = {
  .commit = true, .verb = "commit", .verbing = "committing", .other = "rollback",
  .driving = {TXP_GS_COMMITTING, TXP_GS_ASYNC_COMMITTING}, .begin_to = TXP_GS_ASYNC_COMMITTING,
  .forbid = {TXP_BS_PHASE2_ROLLBACKED, TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE,
             TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE},
  .nforbid = 3};

/* Force the decision 'd' on a global of status 's': refused when the
 * other decision was made (atomicity) or this one is driven already; a
 * Begin global is decided now, a failed or stopped one of this decision
 * driven again. */
static int plan_force(const force_dir_t *d, const char *xid, int s, tc_adm_plan_t *p, char *err, size_t errlen) {
  const char *sn = txp_global_status_name(s);
  bool same = d->commit ? txp_global_status_is_commit(s) : txp_global_status_is_rollback(s);
  bool other = d->commit ? txp_global_status_is_rollback(s) : txp_global_status_is_commit(s);
  if (other)
    return fail(err, errlen,
                "could not %s global transaction \"%s\": it is %s, the decision was %s, and %s now would break "
                "atomicity; use \"redrive\" to finish the %s",
                d->verb, xid, sn, d->other, d->verbing, d->other);
  if (s == d->driving[0] || s == d->driving[1])
    return fail(err, errlen,
                "global transaction \"%s\" is already %s: nothing to force; use \"redrive\" to re-send phase two now",
                xid, sn);
  if (s == TXP_GS_BEGIN) {
    p->action = TC_ADM_ACT_DECIDE;
    p->commit = d->commit;
    p->to = d->begin_to;
  } else if (same && redrive_target(s) > 0) {
    p->action = TC_ADM_ACT_CAS_DRIVE;
    p->to = redrive_target(s);
    p->retry = TC_ADM_RETRY_LEASE;
  } else {
    return fail(err, errlen, "could not %s global transaction \"%s\": it is %s", d->verb, xid, sn);
  }
  for (int i = 0; i < d->nforbid; i++) add_forbid(p, d->forbid[i]);
  return 0;
}

int tc_adm_plan_repair(tc_adm_kind_t kind, const char *xid, int s, const int *bs, int nb, tc_adm_plan_t *p,
                       char *err, size_t errlen) {
  memset(p, 0, sizeof(*p));
  p->from = s;
  p->to = s;
  const char *sn = txp_global_status_name(s);
  bool commit_family = txp_global_status_is_commit(s);
  if (!txp_global_status_valid(s) || s == TXP_GS_FINISHED)
    return fail(err, errlen, "global transaction \"%s\" has status %d (%s): not a live session", xid, s, sn);

  switch (kind) {
  case TC_ADM_ROLLBACK:
  case TC_ADM_COMMIT:
    if (plan_force(kind == TC_ADM_COMMIT ? &force_commit : &force_rollback, xid, s, p, err, errlen) != 0) return -1;
    break;

  case TC_ADM_STOP_RETRY:
    if (!is_phase2(s)) {
      if (s == TXP_GS_STOP_COMMIT_RETRY || s == TXP_GS_STOP_ROLLBACK_RETRY)
        return fail(err, errlen, "retries of global transaction \"%s\" are already stopped (%s)", xid, sn);
      if (s == TXP_GS_BEGIN)
        return fail(err, errlen, "global transaction \"%s\" is Begin: not in phase two, nothing to stop", xid);
      return fail(err, errlen,
                  "global transaction \"%s\" is %s: no retry is scheduled (it waits for an operator already)", xid,
                  sn);
    }
    p->action = TC_ADM_ACT_CAS;
    p->to = commit_family ? TXP_GS_STOP_COMMIT_RETRY : TXP_GS_STOP_ROLLBACK_RETRY;
    p->retry = TC_ADM_RETRY_CLEAR;
    break;

  case TC_ADM_RESUME_RETRY:
    if (s != TXP_GS_STOP_COMMIT_RETRY && s != TXP_GS_STOP_ROLLBACK_RETRY)
      return fail(err, errlen,
                  "retries of global transaction \"%s\" are not stopped (it is %s): nothing to resume", xid, sn);
    p->action = TC_ADM_ACT_CAS;
    p->to = redrive_target(s);
    p->retry = TC_ADM_RETRY_NOW;
    break;

  case TC_ADM_REDRIVE:
    if (s == TXP_GS_BEGIN)
      return fail(err, errlen,
                  "global transaction \"%s\" is Begin: not decided yet, so there is no phase two to re-send; use "
                  "\"commit\" or \"rollback\"",
                  xid);
    p->to = redrive_target(s);
    if (p->to < 0) return fail(err, errlen, "global transaction \"%s\" is %s: nothing to re-drive", xid, sn);
    p->action = TC_ADM_ACT_CAS_DRIVE;
    p->retry = TC_ADM_RETRY_LEASE;
    break;

  default:
    return fail(err, errlen, "\"%s\" of global transaction \"%s\" is not a repair that changes a status",
                tc_adm_kind_name(kind), xid);
  }

  /* Every planned change is a legal edge (an unchanged status only renews
   * the lease and drives again). */
  if (p->from != p->to && !txp_global_transition_ok(p->from, p->to))
    return fail(err, errlen, "could not %s global transaction \"%s\": %s -> %s is not a legal transition",
                tc_adm_kind_name(kind), xid, sn, txp_global_status_name(p->to));
  int bad = first_branch_in(bs, nb, p->forbid, p->nforbid);
  if (bad >= 0)
    return fail(err, errlen,
                "could not %s global transaction \"%s\": a branch is already %s, so this would break atomicity",
                kind == TC_ADM_COMMIT ? "commit" : "roll back", xid, txp_branch_status_name(bs[bad]));
  return 0;
}

/* ---------------------------------------------------------------- config */

int tc_adm_parse_ids(const char *list, unsigned *ids, int max, int *n, char *err, size_t errlen) {
  *n = 0;
  const char *p = list;
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    if (!*p) break;
    char *end;
    errno = 0;
    if (!isdigit((unsigned char)*p)) return fail(err, errlen, "invalid id \"%.32s\": expected a number", p);
    unsigned long v = strtoul(p, &end, 10);
    if (errno || (*end && *end != ',' && *end != ' ' && *end != '\t') || v > 0xfffffffeUL)
      return fail(err, errlen, "invalid id \"%.32s\": expected a number below 4294967295", p);
    if (*n == max) return fail(err, errlen, "too many ids (at most %d)", max);
    ids[(*n)++] = (unsigned)v;
    p = end;
  }
  return 0;
}

int tc_adm_parse_mode(const char *s, unsigned *mode) {
  if (!s || !*s || strlen(s) > 4) return -1;
  unsigned v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '7') return -1;
    v = v * 8 + (unsigned)(*p - '0');
  }
  if (v > 0777) return -1;
  *mode = v;
  return 0;
}

int tc_adm_check_config(const char *path, const char *uids, const char *gids, const char *mode, char *err,
                        size_t errlen) {
  unsigned ids[TC_ADM_MAX_IDS], m;
  int n;
  char why[160];
  if (path[0] == '@')
    return fail(err, errlen, "invalid admin.socket \"%s\": abstract sockets are not supported, use a file path",
                path);
  /* sizeof(sockaddr_un.sun_path) is 108 on Linux: one byte for the NUL. */
  if (strlen(path) > 107)
    return fail(err, errlen, "invalid admin.socket \"%.64s...\": a socket path is at most 107 bytes", path);
  if (path[0] && path[strlen(path) - 1] == '/')
    return fail(err, errlen, "invalid admin.socket \"%s\": names a directory, expected a file path", path);
  if (tc_adm_parse_ids(uids, ids, TC_ADM_MAX_IDS, &n, why, sizeof(why)) != 0)
    return fail(err, errlen, "invalid admin.allow_uids \"%s\": %s", uids, why);
  if (tc_adm_parse_ids(gids, ids, TC_ADM_MAX_IDS, &n, why, sizeof(why)) != 0)
    return fail(err, errlen, "invalid admin.allow_gids \"%s\": %s", gids, why);
  if (tc_adm_parse_mode(mode, &m) != 0)
    return fail(err, errlen, "invalid admin.socket_mode \"%s\": expected an octal mode such as 0600 or 0660", mode);
  return 0;
}
