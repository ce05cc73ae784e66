/*
 * txc_secret.c - a client's registration secret from a file (txc_secret.h).
 */
#include "txc_secret.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

FILE *txc_private_fopen(const char *path, const char *what, char *err, size_t errlen) {
  if (!path || !*path) {
    snprintf(err, errlen, "no %s given", what);
    return NULL;
  }
  FILE *f = fopen(path, "re");
  if (!f) {
    snprintf(err, errlen, "could not open the %s \"%s\": %s", what, path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "the %s \"%s\" is not a regular file", what, path);
    fclose(f);
    return NULL;
  }
  if (st.st_mode & 077) {
    snprintf(err, errlen, "the %s \"%s\" has mode %04o: it must be readable by its owner only (0600 or 0400: chmod 600)",
             what, path, (unsigned)(st.st_mode & 07777));
    fclose(f);
    return NULL;
  }
  return f;
}

int txc_secret_read(const char *path, char *out, size_t cap, char *err, size_t errlen) {
  if (!path || !*path || !out || cap < 2) {
    snprintf(err, errlen, "no secret file given");
    return -1;
  }
  FILE *f = txc_private_fopen(path, "secret file", err, errlen);
  if (!f) return -1;
  char buf[1024];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  bool bad = ferror(f) != 0;
  fclose(f);
  if (bad) {
    snprintf(err, errlen, "could not read secret file \"%s\"", path);
    return -1;
  }
  buf[n] = '\0';
  char *s = buf;
  while (*s == ' ' || *s == '\t') s++;
  size_t len = strcspn(s, "\r\n");
  while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
  if (len == 0 || len >= cap) {
    snprintf(err, errlen, "secret file \"%s\": %s", path, len == 0 ? "empty" : "secret too long");
    memset(buf, 0, sizeof(buf));
    return -1;
  }
  memcpy(out, s, len);
  out[len] = '\0';
  memset(buf, 0, sizeof(buf));
  return 0;
}

int txc_secret_for(const char *app, char *out, size_t cap, const char **source, char *err, size_t errlen) {
  const char *file = getenv("TC_SECRET_FILE"), *dir = getenv("TC_SECRETS_DIR"), *token = getenv("TC_TOKEN");
  if (file && *file) {
    if (source) *source = "TC_SECRET_FILE";
    return txc_secret_read(file, out, cap, err, errlen);
  }
  if (dir && *dir) {
    if (source) *source = "TC_SECRETS_DIR";
    if (!app || !*app || strchr(app, '/') || app[0] == '.') {
      snprintf(err, errlen, "application id \"%s\" cannot name a file in TC_SECRETS_DIR", app ? app : "");
      return -1;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, app);
    return txc_secret_read(path, out, cap, err, errlen);
  }
  if (token && *token) {
    if (source) *source = "TC_TOKEN";
    if (strlen(token) >= cap) {
      snprintf(err, errlen, "TC_TOKEN is too long");
      return -1;
    }
    snprintf(out, cap, "%s", token);
    return 0;
  }
  snprintf(err, errlen, "none of TC_SECRET_FILE, TC_SECRETS_DIR, TC_TOKEN is set");
  return 1;
}
