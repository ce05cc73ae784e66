/* txc_logfile.c - see txc_logfile.h. */
#include "txc_logfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char log_path[PATH_MAX];

int txc_logfile_remember(void) {
  struct stat st;
  log_path[0] = '\0';
  if (fstat(STDERR_FILENO, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  ssize_t n = readlink("/proc/self/fd/2", log_path, sizeof(log_path) - 1);
  if (n <= 0 || log_path[0] != '/') {
    log_path[0] = '\0';
    return 0;
  }
  log_path[n] = '\0';
  return 1;
}

int txc_logfile_reopen(void) {
  if (!log_path[0]) return 0;
  fflush(stderr);
  int fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return -1;
  int rc = dup2(fd, STDERR_FILENO) < 0 ? -1 : 1;
  int saved = errno;
  close(fd);
  errno = saved;
  return rc;
}
