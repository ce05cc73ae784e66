/*
 * fs_report.h - the flash-sale report as a page: flashsale's JSON report
 * (with its "timeline", fs_timeline.h) drawn as one HTML file with SVG
 * charts (purchases and accepted orders per second, p50/p99 latency,
 * requests in flight, stock, available tickets per bucket), the figures
 * and the invariants.
 *
 * NOTES
 *   One self-contained file: no script, no font, no request to anywhere,
 *   so that it opens from disk, from a CI artifact or a mail attachment.
 *   Every text from the report is HTML-escaped.  Each chart carries
 *   data-chart (its title) and data-points (points drawn), for tests.
 */
#ifndef FS_REPORT_H
#define FS_REPORT_H

#include <jansson.h>
#include <stdio.h>

/* Write the page for 'report' to 'f'; 0, or -1 if writing failed. */
int fs_report_html(const json_t *report, FILE *f);

#endif /* FS_REPORT_H */
