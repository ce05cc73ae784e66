/* txc_logfile: reopening the log after logrotate (SIGHUP).
 *
 * tcd and the services log to stderr.  Run as `tcd 2>>/var/log/tcd.log`
 * (or by a supervisor that points stderr at a file), logrotate renames the
 * file and sends SIGHUP: the process must then write to a new file of the
 * old name.  txc_logfile_remember() notes, at start, the path stderr is
 * open on when that is a regular file; txc_logfile_reopen() opens that
 * path again (append, created 0640) onto stderr.  With stderr on a pipe,
 * a terminal or journald, there is nothing to reopen: SIGHUP is logged and
 * changes nothing.  Not thread-safe with itself: call both from the one
 * thread that handles signals. */
#ifndef TXC_LOGFILE_H
#define TXC_LOGFILE_H

/* Remember stderr's path if it is a regular file.  Returns 1 if it is. */
int txc_logfile_remember(void);

/* Reopen the remembered path onto stderr: 1 reopened, 0 nothing to reopen
 * (stderr is not a file), -1 on failure (errno set; stderr unchanged). */
int txc_logfile_reopen(void);

#endif /* TXC_LOGFILE_H */
