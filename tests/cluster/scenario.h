/*
 * scenario.h - what the programs of the cluster scenarios share
 * (cluster_load, cluster_bus): a check is printed ("ok   - ..." or
 * "FAIL - ...") and a failed one counted in scenario_failures, which the
 * program's exit status reports; a sleep that a signal does not cut short.
 */
#ifndef SCENARIO_H
#define SCENARIO_H

#include <stdbool.h>

extern int scenario_failures;

void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sleep_ms(int ms);

#endif /* SCENARIO_H */
