/*
 * txc_procstat.c - process_* metrics from /proc/self (txc_procstat.h).
 */
#include "txc_procstat.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Seconds since the epoch at which the system booted (/proc/stat btime). */
static double boot_time(void) {
  FILE *f = fopen("/proc/stat", "r");
  char line[256];
  double bt = -1;
  if (!f) return -1;
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, "btime ", 6) == 0) {
      bt = strtod(line + 6, NULL);
      break;
    }
  fclose(f);
  return bt;
}

int txc_procstat_read(txc_procstat_t *out) {
  memset(out, 0, sizeof(*out));
  FILE *f = fopen("/proc/self/stat", "r");
  char buf[1024];
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* the command name is in parentheses and may hold spaces: fields
   * start after the last ')' (field 3, the state) */
  char *p = strrchr(buf, ')');
  if (!p) return -1;
  p += 2;
  unsigned long utime = 0, stime = 0, vsize = 0;
  long threads = 0, rss = 0;
  unsigned long long start = 0;
  /* 3 state, 4..13, 14 utime, 15 stime, 16..19, 20 num_threads, 21,
   * 22 starttime, 23 vsize, 24 rss */
  if (sscanf(p,
             "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d %ld %*d %llu %lu %ld",
             &utime, &stime, &threads, &start, &vsize, &rss) != 6)
    return -1;
  long hz = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  if (hz <= 0 || page <= 0) return -1;
  out->cpu_seconds = (double)(utime + stime) / (double)hz;
  out->threads = (double)threads;
  out->virtual_bytes = (double)vsize;
  out->resident_bytes = (double)rss * (double)page;
  double bt = boot_time();
  out->start_time_seconds = bt >= 0 ? bt + (double)start / (double)hz : 0;
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    struct dirent *e;
    long fds = 0;
    while ((e = readdir(d)))
      if (e->d_name[0] != '.') fds++;
    closedir(d);
    out->open_fds = (double)(fds - 1); /* not the one opendir holds */
  }
  struct rlimit rl;
  out->max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (double)rl.rlim_cur : -1;
  return 0;
}

int txc_procstat_format(const txc_procstat_t *p, char *out, size_t cap) {
  int n = snprintf(out, cap,
                   "# HELP process_cpu_seconds_total User and system CPU time spent, in seconds.\n"
                   "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.2f\n"
                   "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
                   "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %.0f\n"
                   "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
                   "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %.0f\n"
                   "# HELP process_open_fds Open file descriptors.\n"
                   "# TYPE process_open_fds gauge\nprocess_open_fds %.0f\n"
                   "# HELP process_max_fds Most file descriptors the process may open (-1: unlimited).\n"
                   "# TYPE process_max_fds gauge\nprocess_max_fds %.0f\n"
                   "# HELP process_start_time_seconds Start time of the process since the epoch, in seconds.\n"
                   "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n"
                   "# HELP process_threads Threads of the process.\n"
                   "# TYPE process_threads gauge\nprocess_threads %.0f\n",
                   p->cpu_seconds, p->resident_bytes, p->virtual_bytes, p->open_fds, p->max_fds,
                   p->start_time_seconds, p->threads);
  return n < 0 || (size_t)n >= cap ? -1 : n;
}
