/*
 * console_log.h - the console's log: one JSON object per line on stderr
 * ({"ts","level","msg"}), info and above.
 */
#ifndef CONSOLE_LOG_H
#define CONSOLE_LOG_H

void console_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* CONSOLE_LOG_H */
