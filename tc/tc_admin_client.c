/*
 * tc_admin_client.c - one request to a tcd admin socket (tc_admin_client.h).
 */
#include "tc_admin_client.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int tc_admin_talk(const char *path, const char *line, double timeout_s, size_t max_answer, char **out, char *why,
                  size_t whylen) {
  *out = NULL;
  why[0] = '\0';
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof(sa.sun_path)) {
    snprintf(why, whylen, "socket path \"%s\" is too long", path);
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    int e = errno;
    snprintf(why, whylen, "could not connect to admin socket \"%s\": %s%s", path, strerror(e),
            e == ENOENT         ? " (is tcd running with admin.socket set?)"
            : e == EACCES       ? " (the socket's mode does not let you in)"
            : e == ECONNREFUSED ? " (no tcd is listening on it)"
                                : "");
    if (fd >= 0) close(fd);
    return -1;
  }
  size_t len = strlen(line), off = 0;
  char *req = malloc(len + 2);
  if (!req) {
    snprintf(why, whylen, "out of memory");
    close(fd);
    return -1;
  }
  memcpy(req, line, len);
  req[len++] = '\n';
  int send_errno = 0;
  while (off < len) {
    ssize_t n = send(fd, req + off, len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      /* tcd may have answered and closed already (a refused peer): what
       * it said is still there to read. */
      send_errno = n < 0 ? errno : EPIPE;
      break;
    }
    off += (size_t)n;
  }
  free(req);
  size_t cap = 65536, got = 0;
  char *buf = malloc(cap);
  double deadline = mono_ms() + timeout_s * 1000.0;
  int rc = -1;
  while (buf) {
    char *nl = got ? memchr(buf, '\n', got) : NULL;
    if (nl) {
      *nl = '\0';
      *out = buf;
      buf = NULL;
      rc = 0;
      break;
    }
    double left = deadline - mono_ms();
    if (left <= 0) {
      snprintf(why, whylen, "no answer from \"%s\" within %.0f s", path, timeout_s);
      break;
    }
    struct pollfd p = {fd, POLLIN, 0};
    int pr = poll(&p, 1, left > 60000 ? 60000 : (int)left + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    if (got + 4096 > cap) {
      if (cap >= max_answer) {
        snprintf(why, whylen, "answer larger than %zu bytes", max_answer);
        break;
      }
      char *nb = realloc(buf, cap * 2);
      if (!nb) break;
      buf = nb;
      cap *= 2;
    }
    ssize_t n = recv(fd, buf + got, cap - got - 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (send_errno)
        snprintf(why, whylen, "could not send the request to \"%s\": %s", path, strerror(send_errno));
      else
        snprintf(why, whylen, "connection to \"%s\" closed before the answer%s%s", path, n < 0 ? ": " : "",
                 n < 0 ? strerror(errno) : "");
      break;
    }
    got += (size_t)n;
  }
  free(buf);
  close(fd);
  return rc;
}
