/*
 * tc_creds.c - the credentials file (tc_creds.h).
 */
#include "tc_creds.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "txc_secret.h"
#include "txp_msg.h"

#define CREDS_MAX 10000

typedef struct cred {
  char app[TXP_MAX_NAME_LEN + 1];
  char group[TXP_MAX_NAME_LEN + 1];
  char secret[TXP_MAX_TOKEN_LEN + 1];
  size_t secret_len;
} cred_t;

struct tc_creds {
  cred_t *v;
  size_t n, cap, apps;
};

bool tc_creds_secret_equal(const char *given, const char *want, size_t want_len) {
  size_t glen = strnlen(given, want_len + 1);
  volatile unsigned char diff = (unsigned char)(glen != want_len);
  for (size_t i = 0; i < want_len; i++) {
    unsigned char g = i < glen ? (unsigned char)given[i] : 0;
    diff |= (unsigned char)(g ^ (unsigned char)want[i]);
  }
  return diff == 0;
}

/* Application ids and group names: what a log line or a store column can
 * carry without quoting. */
static bool name_ok(const char *s, size_t n) {
  if (n == 0 || n > TXP_MAX_NAME_LEN) return false;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '_' || ch == '.';
    if (!ok) return false;
  }
  return true;
}

static bool secret_ok(const char *s, size_t n) {
  if (n < TC_CREDS_SECRET_MIN || n > TXP_MAX_TOKEN_LEN) return false;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f) return false;
  return true;
}

/* The next blank-separated field of '*p'; its length in '*n'. */
static const char *field(const char **p, size_t *n) {
  const char *s = *p;
  while (*s == ' ' || *s == '\t') s++;
  const char *e = s;
  while (*e && *e != ' ' && *e != '\t') e++;
  *n = (size_t)(e - s);
  *p = e;
  return s;
}

static const cred_t *find_app(const tc_creds_t *c, const char *app) {
  for (size_t i = 0; i < c->n; i++)
    if (strcmp(c->v[i].app, app) == 0) return &c->v[i];
  return NULL;
}

static int add_line(tc_creds_t *c, const char *line, int lineno, const char *path, char *err, size_t errlen) {
  const char *p = line, *app, *group, *secret, *rest;
  size_t an, gn, sn, rn;
  app = field(&p, &an);
  if (an == 0 || app[0] == '#') return 0; /* blank or comment */
  group = field(&p, &gn);
  secret = field(&p, &sn);
  rest = field(&p, &rn);
  (void)rest;
  if (gn == 0 || sn == 0 || rn != 0) {
    snprintf(err, errlen, "%s:%d: expected \"application_id group secret\"", path, lineno);
    return -1;
  }
  if (!name_ok(app, an) || !name_ok(group, gn)) {
    snprintf(err, errlen,
             "%s:%d: application id and group must be 1 to %d of A-Z a-z 0-9 - _ .", path, lineno,
             TXP_MAX_NAME_LEN);
    return -1;
  }
  if (!secret_ok(secret, sn)) {
    snprintf(err, errlen, "%s:%d: the secret must be %d to %d printable bytes without blanks", path,
             lineno, TC_CREDS_SECRET_MIN, TXP_MAX_TOKEN_LEN);
    return -1;
  }
  if (c->n == CREDS_MAX) {
    snprintf(err, errlen, "%s:%d: more than %d credentials", path, lineno, CREDS_MAX);
    return -1;
  }
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 16;
    cred_t *v = realloc(c->v, cap * sizeof(*v));
    if (!v) {
      snprintf(err, errlen, "%s: out of memory", path);
      return -1;
    }
    c->v = v;
    c->cap = cap;
  }
  cred_t *k = &c->v[c->n];
  memcpy(k->app, app, an);
  k->app[an] = '\0';
  memcpy(k->group, group, gn);
  k->group[gn] = '\0';
  memcpy(k->secret, secret, sn);
  k->secret[sn] = '\0';
  k->secret_len = sn;
  const cred_t *same = find_app(c, k->app);
  if (same && strcmp(same->group, k->group) != 0) {
    snprintf(err, errlen, "%s:%d: application \"%s\" is in group \"%s\" on an earlier line: one group per application",
             path, lineno, k->app, same->group);
    return -1;
  }
  if (!same) c->apps++;
  c->n++;
  return 0;
}

tc_creds_t *tc_creds_load(const char *path, char *err, size_t errlen) {
  FILE *f = txc_private_fopen(path, "credentials file", err, errlen);
  if (!f) return NULL;
  tc_creds_t *c = calloc(1, sizeof(*c));
  if (!c) {
    snprintf(err, errlen, "out of memory");
    fclose(f);
    return NULL;
  }
  char line[1024];
  int lineno = 0;
  while (fgets(line, sizeof(line), f)) {
    lineno++;
    size_t n = strlen(line);
    if (n == sizeof(line) - 1 && line[n - 1] != '\n') {
      snprintf(err, errlen, "%s:%d: line too long", path, lineno);
      goto fail;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    if (add_line(c, line, lineno, path, err, errlen) != 0) goto fail;
  }
  if (ferror(f)) {
    snprintf(err, errlen, "could not read credentials file \"%s\": %s", path, strerror(errno));
    goto fail;
  }
  if (c->n == 0) {
    snprintf(err, errlen, "credentials file \"%s\" has no credential", path);
    goto fail;
  }
  fclose(f);
  return c;
fail:
  fclose(f);
  tc_creds_free(c);
  return NULL;
}

void tc_creds_free(tc_creds_t *c) {
  if (!c) return;
  if (c->v) {
    /* Secrets do not outlive the table in freed memory. */
    volatile unsigned char *p = (volatile unsigned char *)c->v;
    for (size_t i = 0; i < c->cap * sizeof(*c->v); i++) p[i] = 0;
  }
  free(c->v);
  free(c);
}

size_t tc_creds_count(const tc_creds_t *c) { return c ? c->n : 0; }
size_t tc_creds_apps(const tc_creds_t *c) { return c ? c->apps : 0; }

const char *tc_creds_check(const tc_creds_t *c, const char *app, const char *secret, bool *known) {
  const char *group = NULL;
  bool seen = false;
  if (c && app && secret) {
    for (size_t i = 0; i < c->n; i++) {
      if (strcmp(c->v[i].app, app) != 0) continue;
      seen = true;
      /* No early exit: every secret of the application is compared. */
      if (tc_creds_secret_equal(secret, c->v[i].secret, c->v[i].secret_len)) group = c->v[i].group;
    }
  }
  if (known) *known = seen;
  return group;
}
