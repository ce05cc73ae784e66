/*
 * test_admin_cmd.c - the admin socket's request parser and repair planner
 * (tc/tc_admin_cmd.c), fed directly: no socket, no loop, no database.
 *
 * NOTES
 *   Parser: every command with its options, then malformed lines, each
 *   checked for the error naming what was wrong and for a cleared command.
 *   Planner: a table of (repair, stored status) -> expected plan, one
 *   of (repair, stored status) -> refusal and its reason, then an
 *   exhaustive sweep asserting the invariants every plan must keep
 *   whatever the input: a status change is a legal edge of
 *   txp_global_transition_ok, a repair never crosses the commit/rollback
 *   families, and a forbidden branch status always refuses.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_admin_cmd.h"

static int parse(const char *line, tc_adm_cmd_t *c, char *err, size_t errlen) {
  return tc_adm_parse(line, strlen(line), c, err, errlen);
}

static void parse_ok(const char *line, tc_adm_cmd_t *c) {
  char err[512] = "";
  if (parse(line, c, err, sizeof(err)) != 0) fail_msg("\"%s\" did not parse: %s", line, err);
}

/* 'line' must parse as a command of 'kind'. */
static void parse_as(const char *line, tc_adm_kind_t kind, tc_adm_cmd_t *c) {
  parse_ok(line, c);
  assert_int_equal(c->kind, kind);
}

/* 'line' must fail with an error containing 'want'. */
static void parse_bad(const char *line, const char *want) {
  tc_adm_cmd_t c;
  char err[512] = "";
  int rc = parse(line, &c, err, sizeof(err));
  if (rc == 0) fail_msg("\"%s\" parsed, expected an error about \"%s\"", line, want);
  if (!strstr(err, want)) fail_msg("\"%s\": error \"%s\" does not mention \"%s\"", line, err, want);
  assert_int_equal(c.kind, TC_ADM_NONE); /* nothing half-filled */
  assert_false(c.has_xid);
}

/* ---------------------------------------------------------------- parse */

static void test_show_globals(void **state) {
  (void)state;
  tc_adm_cmd_t c;
  parse_as("show globals", TC_ADM_SHOW_GLOBALS, &c);
  assert_int_equal(c.nstatuses, 0);
  assert_false(c.has_min_age);
  assert_false(c.has_name);
  assert_int_equal(c.limit, TC_ADM_DEFAULT_LIMIT);

  parse_ok("show globals status=Rollbacking limit=50", &c);
  assert_int_equal(c.nstatuses, 1);
  assert_int_equal(c.statuses[0], TXP_GS_ROLLBACKING);
  assert_int_equal(c.limit, 50);

  parse_as("  SHOW   Globals\tstatus=begin,13,rollbackretrying  min_age=2.5 name=\"buy ticket\" LIMIT=10000\r",
           TC_ADM_SHOW_GLOBALS, &c);
  assert_int_equal(c.nstatuses, 3);
  assert_int_equal(c.statuses[0], TXP_GS_BEGIN);
  assert_int_equal(c.statuses[1], TXP_GS_ROLLBACK_FAILED);
  assert_int_equal(c.statuses[2], TXP_GS_ROLLBACK_RETRYING);
  assert_true(c.has_min_age);
  assert_true(c.min_age_s > 2.49 && c.min_age_s < 2.51);
  assert_true(c.has_name);
  assert_string_equal(c.name, "buy ticket");
  assert_int_equal(c.limit, TC_ADM_MAX_LIMIT);

  parse_ok("show globals min_age=0", &c);
  assert_true(c.has_min_age);
  assert_true(c.min_age_s == 0);
}

static void test_show_history(void **state) {
  (void)state;
  tc_adm_cmd_t c;
  parse_as("show history", TC_ADM_SHOW_HISTORY, &c);
  assert_false(c.since.set);
  assert_false(c.until.set);
  assert_false(c.has_xid);
  assert_int_equal(c.limit, TC_ADM_DEFAULT_LIMIT);
  assert_false(tc_adm_is_repair(TC_ADM_SHOW_HISTORY));

  parse_ok("SHOW HISTORY xid=a:1:2 status=Committed,Rollbacked name=buy since=15m until=90 limit=7", &c);
  assert_true(c.has_xid);
  assert_string_equal(c.xid, "a:1:2");
  assert_int_equal(c.nstatuses, 2);
  assert_int_equal(c.statuses[0], TXP_GS_COMMITTED);
  assert_int_equal(c.statuses[1], TXP_GS_ROLLBACKED);
  assert_string_equal(c.name, "buy");
  assert_true(c.since.set && c.since.ago);
  assert_true(c.since.s == 900.0);
  assert_true(c.until.set && c.until.ago);
  assert_true(c.until.s == 90.0);
  assert_int_equal(c.limit, 7);
  assert_true(tc_adm_time_unix(&c.since, 10000.0) == 9100.0);

  /* Absolute UTC times: a date, minutes, seconds, Z, a blank for the T. */
  tc_adm_time_t t;
  char err[256];
  assert_int_equal(tc_adm_parse_time("2026-12-03", &t, err, sizeof(err)), 0);
  assert_false(t.ago);
  assert_true(t.s == 1796256000.0);
  assert_int_equal(tc_adm_parse_time("2026-12-03T15:04", &t, err, sizeof(err)), 0);
  assert_true(t.s == 1796256000.0 + 15 * 3600 + 4 * 60);
  assert_int_equal(tc_adm_parse_time("2026-12-03T15:04:05Z", &t, err, sizeof(err)), 0);
  assert_true(t.s == 1796256000.0 + 15 * 3600 + 4 * 60 + 5);
  assert_int_equal(tc_adm_parse_time("2026-12-03 15:04:05", &t, err, sizeof(err)), 0);
  assert_true(tc_adm_time_unix(&t, 0) == 1796256000.0 + 15 * 3600 + 4 * 60 + 5);
  assert_int_equal(tc_adm_parse_time("1.5h", &t, err, sizeof(err)), 0);
  assert_true(t.ago && t.s == 5400.0);
  assert_int_equal(tc_adm_parse_time("7d", &t, err, sizeof(err)), 0);
  assert_true(t.s == 7 * 86400.0);

  parse_bad("show history since=2026-02-31", "invalid time");
  parse_bad("show history since=2026-13-01", "invalid time");
  parse_bad("show history since=2026-12-03T25:00", "invalid time");
  parse_bad("show history since=2026-12-03T15:04:05+01", "invalid time");
  parse_bad("show history since=15w", "invalid time");
  parse_bad("show history since=-5m", "invalid time");
  parse_bad("show history since=0x10", "invalid time");
  parse_bad("show history since=1e3", "invalid time");
  parse_bad("show history since=", "invalid time");
  parse_bad("show history since=99999d", "more than ten years");
  parse_bad("show history since=1m since=2m", "given twice");
  parse_bad("show history xid=a xid=b", "given twice");
  parse_bad("show history later", "unexpected argument");
  parse_bad("show history frob=1", "unknown option \"frob\"");
  parse_bad("show history status=Nope", "unknown global status");
  parse_bad("show history limit=0", "invalid value");
}

static void test_show_one_and_others(void **state) {
  (void)state;
  tc_adm_cmd_t c;
  parse_as("show global 127.0.0.1:8091:4097", TC_ADM_SHOW_GLOBAL, &c);
  assert_true(c.has_xid);
  assert_string_equal(c.xid, "127.0.0.1:8091:4097");

  parse_as("show locks", TC_ADM_SHOW_LOCKS, &c);
  assert_int_equal(c.limit, 1000);
  assert_false(c.has_xid || c.has_key || c.has_prefix);
  parse_ok("show locks xid=a:1 key=db^^^t^^^1 limit=5", &c);
  assert_true(c.has_xid);
  assert_string_equal(c.xid, "a:1");
  assert_true(c.has_key);
  assert_false(c.has_prefix);
  assert_string_equal(c.key, "db^^^t^^^1");
  assert_int_equal(c.limit, 5);
  parse_ok("show locks prefix=\"db^^^t^^^\"", &c);
  assert_true(c.has_prefix);
  assert_string_equal(c.key, "db^^^t^^^");

  parse_as("show nodes", TC_ADM_SHOW_NODES, &c);
  parse_as("stats", TC_ADM_STATS, &c);
  parse_as("help", TC_ADM_HELP, &c);

  /* blank lines are nothing, not an error */
  parse_as("", TC_ADM_NONE, &c);
  parse_as("  \t \r", TC_ADM_NONE, &c);
}

static void test_repairs(void **state) {
  (void)state;
  static const struct {
    const char *word;
    tc_adm_kind_t kind;
  } r[] = {
    {"rollback", TC_ADM_ROLLBACK},         {"commit", TC_ADM_COMMIT},   {"stop-retry", TC_ADM_STOP_RETRY},
    {"resume-retry", TC_ADM_RESUME_RETRY}, {"redrive", TC_ADM_REDRIVE}, {"delete", TC_ADM_DELETE},
  };
  for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
    char line[256];
    tc_adm_cmd_t c;
    snprintf(line, sizeof(line), "%s 10.0.0.1:8091:%zu", r[i].word, i + 1);
    parse_as(line, r[i].kind, &c);
    assert_true(tc_adm_is_repair(c.kind));
    assert_string_equal(tc_adm_kind_name(c.kind), r[i].word);
    char want[64];
    snprintf(want, sizeof(want), "10.0.0.1:8091:%zu", i + 1);
    assert_string_equal(c.xid, want);

    snprintf(line, sizeof(line), "%s", r[i].word);
    parse_bad(line, "missing XID");
    snprintf(line, sizeof(line), "%s a:1 b:2", r[i].word);
    parse_bad(line, "unexpected argument \"b:2\"");
  }
  assert_false(tc_adm_is_repair(TC_ADM_SHOW_GLOBALS));
  assert_false(tc_adm_is_repair(TC_ADM_STATS));

  /* the longest xid there is, and one byte more */
  char line[400], xid[TXP_MAX_XID_LEN + 2];
  memset(xid, 'x', TXP_MAX_XID_LEN);
  xid[TXP_MAX_XID_LEN] = '\0';
  snprintf(line, sizeof(line), "redrive %s", xid);
  tc_adm_cmd_t c;
  parse_ok(line, &c);
  assert_int_equal(strlen(c.xid), TXP_MAX_XID_LEN);
  xid[TXP_MAX_XID_LEN] = 'x';
  xid[TXP_MAX_XID_LEN + 1] = '\0';
  snprintf(line, sizeof(line), "redrive %s", xid);
  parse_bad(line, "at most 128");
  parse_bad("rollback \"\"", "empty XID");
}

static void test_failpoint_commands(void **state) {
  (void)state;
  tc_adm_cmd_t c;
  parse_as("failpoint list", TC_ADM_FAILPOINT_LIST, &c);
  parse_as("FAILPOINT arm tc.commit.after_decision=abort@3,rm.at.after_register=stop", TC_ADM_FAILPOINT_ARM,
           &c);
  assert_string_equal(c.spec, "tc.commit.after_decision=abort@3,rm.at.after_register=stop");
  assert_string_equal(tc_adm_kind_name(c.kind), "failpoint arm");
  parse_bad("failpoint", "usage");
  parse_bad("failpoint list now", "takes no arguments");
  parse_bad("failpoint arm", "usage");
  parse_bad("failpoint arm a=b c=d", "usage");
  parse_bad("failpoint arm tc.no.such=abort", "unknown failpoint");
  parse_bad("failpoint arm tc.begin.after_store=boom", "unknown action");
  parse_bad("failpoint arm tc.begin.after_store=abort@0", "hit count");
}

static void test_malformed(void **state) {
  (void)state;
  parse_bad("frobnicate", "unknown command \"frobnicate\"");
  parse_bad("show", "missing object");
  parse_bad("show everything", "unknown object \"everything\"");
  parse_bad("show globals stauts=Begin", "unknown option \"stauts\"");
  parse_bad("show globals Begin", "unexpected argument \"Begin\"");
  parse_bad("show globals =x", "unexpected argument \"=x\"");
  parse_bad("show globals status=Bogus", "unknown global status \"Bogus\"");
  parse_bad("show globals status=99", "unknown global status \"99\"");
  parse_bad("show globals status=", "empty value for \"status\"");
  parse_bad("show globals status=Begin,", "trailing comma");
  parse_bad("show globals status=Begin status=Rollbacking", "\"status\" given twice");
  parse_bad("show globals limit=0", "invalid value \"0\" for \"limit\"");
  parse_bad("show globals limit=10001", "invalid value \"10001\" for \"limit\"");
  parse_bad("show globals limit=12abc", "invalid value \"12abc\" for \"limit\"");
  parse_bad("show globals limit=5 limit=6", "\"limit\" given twice");
  parse_bad("show globals min_age=-1", "invalid value \"-1\" for \"min_age\"");
  parse_bad("show globals min_age=nan", "invalid value \"nan\" for \"min_age\"");
  parse_bad("show globals min_age=1e99", "for \"min_age\"");
  parse_bad("show globals name=", "invalid value for \"name\"");
  parse_bad("show global", "missing XID");
  parse_bad("show locks key=a prefix=b", "one of \"key\" and \"prefix\"");
  parse_bad("show locks key=", "invalid value for \"key\"");
  parse_bad("show locks owner=x", "unknown option \"owner\"");
  parse_bad("show nodes now", "takes no arguments");
  parse_bad("stats please", "takes no arguments");
  parse_bad("help me", "takes no arguments");
  /* bytes that are not text */
  parse_bad("stats\x01", "control character (byte 0x01 at offset 5)");
  parse_bad("show global a\x7f", "control character");
  parse_bad("rollback \xff\xfe", "not valid UTF-8");
  parse_bad("rollback \xc0\xaf", "not valid UTF-8");       /* overlong '/' */
  parse_bad("rollback \xed\xa0\x80", "not valid UTF-8");   /* a surrogate */
  parse_bad("rollback \xe2\x82", "not valid UTF-8");       /* cut short */
  /* quoting */
  parse_bad("show globals name=\"open", "unterminated quoted word");
  parse_bad("show globals name=\"a\\nb\"", "unknown escape");
  parse_bad("show globals a=1 b=2 c=3 d=4 e=5 f=6 g=7 h=8 i=9 j=10 k=11 l=12 m=13 n=14 o=15",
            "too many words");
  /* an embedded NUL is a control character, not the end of the line */
  tc_adm_cmd_t c;
  char err[256];
  assert_int_equal(tc_adm_parse("stats\0x", 7, &c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "control character"));

  /* valid UTF-8 is fine */
  parse_ok("show globals name=\"caf\xc3\xa9 \xe2\x82\xac\"", &c);
  assert_string_equal(c.name, "caf\xc3\xa9 \xe2\x82\xac");
}

static void test_quote_roundtrip(void **state) {
  (void)state;
  static const char *const words[] = {"plain", "with space", "q\"uote", "back\\slash", "", "tab\there", "a=b"};
  for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
    char q[128], line[256];
    assert_true(tc_adm_quote(words[i], q, sizeof(q)) >= 0);
    snprintf(line, sizeof(line), "show globals name=%s", q);
    tc_adm_cmd_t c;
    char err[256];
    int rc = parse(line, &c, err, sizeof(err));
    if (words[i][0] == '\0') {
      assert_int_equal(rc, -1); /* an empty name is refused, but parsed as such */
      continue;
    }
    if (rc != 0) fail_msg("\"%s\": %s", line, err);
    assert_string_equal(c.name, words[i]);
  }
  char tiny[4];
  assert_int_equal(tc_adm_quote("long word", tiny, sizeof(tiny)), -1);
}

/* --------------------------------------------------------------- repairs */

/* A repair the planner carries out: from 'status', by 'action', to 'to'. */
typedef struct {
  tc_adm_kind_t kind;
  int status;
  int action;
  int to;
} plan_case_t;

/* A repair the planner refuses: its message says 'why'. */
typedef struct {
  tc_adm_kind_t kind;
  int status;
  const char *why;
} refusal_case_t;

static void test_plan_table(void **state) {
  (void)state;
  static const plan_case_t cases[] = {
    /* force rollback */
    {TC_ADM_ROLLBACK, TXP_GS_BEGIN, TC_ADM_ACT_DECIDE, TXP_GS_ROLLBACKING},
    {TC_ADM_ROLLBACK, TXP_GS_ROLLBACK_RETRYING, TC_ADM_ACT_CAS_DRIVE, TXP_GS_ROLLBACK_RETRYING},
    {TC_ADM_ROLLBACK, TXP_GS_TIMEOUT_ROLLBACK_RETRYING, TC_ADM_ACT_CAS_DRIVE, TXP_GS_TIMEOUT_ROLLBACK_RETRYING},
    {TC_ADM_ROLLBACK, TXP_GS_ROLLBACK_FAILED, TC_ADM_ACT_CAS_DRIVE, TXP_GS_ROLLBACK_RETRYING},
    {TC_ADM_ROLLBACK, TXP_GS_TIMEOUT_ROLLBACK_FAILED, TC_ADM_ACT_CAS_DRIVE, TXP_GS_TIMEOUT_ROLLBACK_RETRYING},
    {TC_ADM_ROLLBACK, TXP_GS_STOP_ROLLBACK_RETRY, TC_ADM_ACT_CAS_DRIVE, TXP_GS_ROLLBACK_RETRYING},
    /* force commit */
    {TC_ADM_COMMIT, TXP_GS_BEGIN, TC_ADM_ACT_DECIDE, TXP_GS_ASYNC_COMMITTING},
    {TC_ADM_COMMIT, TXP_GS_COMMIT_RETRYING, TC_ADM_ACT_CAS_DRIVE, TXP_GS_COMMIT_RETRYING},
    {TC_ADM_COMMIT, TXP_GS_COMMIT_FAILED, TC_ADM_ACT_CAS_DRIVE, TXP_GS_COMMIT_RETRYING},
    {TC_ADM_COMMIT, TXP_GS_STOP_COMMIT_RETRY, TC_ADM_ACT_CAS_DRIVE, TXP_GS_COMMIT_RETRYING},
    /* stop retries */
    {TC_ADM_STOP_RETRY, TXP_GS_ASYNC_COMMITTING, TC_ADM_ACT_CAS, TXP_GS_STOP_COMMIT_RETRY},
    {TC_ADM_STOP_RETRY, TXP_GS_COMMITTING, TC_ADM_ACT_CAS, TXP_GS_STOP_COMMIT_RETRY},
    {TC_ADM_STOP_RETRY, TXP_GS_COMMIT_RETRYING, TC_ADM_ACT_CAS, TXP_GS_STOP_COMMIT_RETRY},
    {TC_ADM_STOP_RETRY, TXP_GS_ROLLBACKING, TC_ADM_ACT_CAS, TXP_GS_STOP_ROLLBACK_RETRY},
    {TC_ADM_STOP_RETRY, TXP_GS_ROLLBACK_RETRYING, TC_ADM_ACT_CAS, TXP_GS_STOP_ROLLBACK_RETRY},
    {TC_ADM_STOP_RETRY, TXP_GS_TIMEOUT_ROLLBACKING, TC_ADM_ACT_CAS, TXP_GS_STOP_ROLLBACK_RETRY},
    {TC_ADM_STOP_RETRY, TXP_GS_TIMEOUT_ROLLBACK_RETRYING, TC_ADM_ACT_CAS, TXP_GS_STOP_ROLLBACK_RETRY},
    /* resume */
    {TC_ADM_RESUME_RETRY, TXP_GS_STOP_COMMIT_RETRY, TC_ADM_ACT_CAS, TXP_GS_COMMIT_RETRYING},
    {TC_ADM_RESUME_RETRY, TXP_GS_STOP_ROLLBACK_RETRY, TC_ADM_ACT_CAS, TXP_GS_ROLLBACK_RETRYING},
    /* re-drive */
    {TC_ADM_REDRIVE, TXP_GS_ASYNC_COMMITTING, TC_ADM_ACT_CAS_DRIVE, TXP_GS_ASYNC_COMMITTING},
    {TC_ADM_REDRIVE, TXP_GS_ROLLBACKING, TC_ADM_ACT_CAS_DRIVE, TXP_GS_ROLLBACKING},
    {TC_ADM_REDRIVE, TXP_GS_COMMIT_FAILED, TC_ADM_ACT_CAS_DRIVE, TXP_GS_COMMIT_RETRYING},
    {TC_ADM_REDRIVE, TXP_GS_ROLLBACK_FAILED, TC_ADM_ACT_CAS_DRIVE, TXP_GS_ROLLBACK_RETRYING},
    {TC_ADM_REDRIVE, TXP_GS_TIMEOUT_ROLLBACK_FAILED, TC_ADM_ACT_CAS_DRIVE, TXP_GS_TIMEOUT_ROLLBACK_RETRYING},
    {TC_ADM_REDRIVE, TXP_GS_STOP_COMMIT_RETRY, TC_ADM_ACT_CAS_DRIVE, TXP_GS_COMMIT_RETRYING},
    {TC_ADM_REDRIVE, TXP_GS_STOP_ROLLBACK_RETRY, TC_ADM_ACT_CAS_DRIVE, TXP_GS_ROLLBACK_RETRYING},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const plan_case_t *pc = &cases[i];
    tc_adm_plan_t p;
    char err[512] = "";
    int rc = tc_adm_plan_repair(pc->kind, "x:1", pc->status, NULL, 0, &p, err, sizeof(err));
    if (rc != 0) fail_msg("%s of %s refused: %s", tc_adm_kind_name(pc->kind), txp_global_status_name(pc->status), err);
    assert_int_equal(p.action, pc->action);
    assert_int_equal(p.from, pc->status);
    if (p.to != pc->to)
      fail_msg("%s of %s goes to %s, expected %s", tc_adm_kind_name(pc->kind), txp_global_status_name(pc->status),
               txp_global_status_name(p.to), txp_global_status_name(pc->to));
    if (pc->action == TC_ADM_ACT_DECIDE) assert_int_equal(p.commit, pc->kind == TC_ADM_COMMIT);
    if (pc->action == TC_ADM_ACT_CAS_DRIVE) assert_int_equal(p.retry, TC_ADM_RETRY_LEASE);
    if (pc->kind == TC_ADM_STOP_RETRY) assert_int_equal(p.retry, TC_ADM_RETRY_CLEAR);
    if (pc->kind == TC_ADM_RESUME_RETRY) assert_int_equal(p.retry, TC_ADM_RETRY_NOW);
  }
}

static void test_refusal_table(void **state) {
  (void)state;
  static const refusal_case_t cases[] = {
    /* force rollback */
    {TC_ADM_ROLLBACK, TXP_GS_ROLLBACKING, "already Rollbacking"},
    {TC_ADM_ROLLBACK, TXP_GS_TIMEOUT_ROLLBACKING, "already TimeoutRollbacking"},
    {TC_ADM_ROLLBACK, TXP_GS_ASYNC_COMMITTING, "break atomicity"},
    {TC_ADM_ROLLBACK, TXP_GS_COMMITTING, "the decision was commit"},
    {TC_ADM_ROLLBACK, TXP_GS_COMMIT_RETRYING, "the decision was commit"},
    {TC_ADM_ROLLBACK, TXP_GS_COMMIT_FAILED, "the decision was commit"},
    {TC_ADM_ROLLBACK, TXP_GS_STOP_COMMIT_RETRY, "the decision was commit"},
    {TC_ADM_ROLLBACK, TXP_GS_FINISHED, "not a live session"},
    {TC_ADM_ROLLBACK, 0, "not a live session"},
    /* force commit */
    {TC_ADM_COMMIT, TXP_GS_ASYNC_COMMITTING, "already AsyncCommitting"},
    {TC_ADM_COMMIT, TXP_GS_COMMITTING, "already Committing"},
    {TC_ADM_COMMIT, TXP_GS_ROLLBACKING, "the decision was rollback"},
    {TC_ADM_COMMIT, TXP_GS_ROLLBACK_FAILED, "break atomicity"},
    {TC_ADM_COMMIT, TXP_GS_TIMEOUT_ROLLBACKING, "the decision was rollback"},
    {TC_ADM_COMMIT, TXP_GS_STOP_ROLLBACK_RETRY, "the decision was rollback"},
    /* stop retries */
    {TC_ADM_STOP_RETRY, TXP_GS_BEGIN, "not in phase two"},
    {TC_ADM_STOP_RETRY, TXP_GS_ROLLBACK_FAILED, "no retry is scheduled"},
    {TC_ADM_STOP_RETRY, TXP_GS_STOP_ROLLBACK_RETRY, "already stopped"},
    /* resume */
    {TC_ADM_RESUME_RETRY, TXP_GS_ROLLBACK_RETRYING, "not stopped"},
    {TC_ADM_RESUME_RETRY, TXP_GS_BEGIN, "not stopped"},
    /* re-drive */
    {TC_ADM_REDRIVE, TXP_GS_BEGIN, "not decided yet"},
    {TC_ADM_REDRIVE, TXP_GS_COMMITTED, "nothing to re-drive"},
    /* delete is not a status change */
    {TC_ADM_DELETE, TXP_GS_BEGIN, "not a repair that changes a status"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const refusal_case_t *rc = &cases[i];
    tc_adm_plan_t p;
    char err[512] = "";
    if (tc_adm_plan_repair(rc->kind, "x:1", rc->status, NULL, 0, &p, err, sizeof(err)) == 0)
      fail_msg("%s of %s was planned (to %s), expected a refusal", tc_adm_kind_name(rc->kind),
               txp_global_status_name(rc->status), txp_global_status_name(p.to));
    if (!strstr(err, rc->why))
      fail_msg("%s of %s: \"%s\" does not say \"%s\"", tc_adm_kind_name(rc->kind),
               txp_global_status_name(rc->status), err, rc->why);
    assert_non_null(strstr(err, "\"x:1\"")); /* names the transaction */
  }
}

static void test_plan_branch_guards(void **state) {
  (void)state;
  tc_adm_plan_t p;
  char err[512];
  /* a rollback with a committed branch would break atomicity */
  int committed[] = {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_COMMITTED};
  assert_int_equal(tc_adm_plan_repair(TC_ADM_ROLLBACK, "x:2", TXP_GS_ROLLBACK_FAILED, committed, 2, &p, err,
                                      sizeof(err)),
                   -1);
  assert_non_null(strstr(err, "PhaseTwoCommitted"));
  assert_non_null(strstr(err, "break atomicity"));
  /* and the guard goes with the plan into SQL */
  int fine[] = {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE};
  assert_int_equal(tc_adm_plan_repair(TC_ADM_ROLLBACK, "x:2", TXP_GS_ROLLBACK_FAILED, fine, 2, &p, err, sizeof(err)), 0);
  assert_int_equal(p.nforbid, 1);
  assert_int_equal(p.forbid[0], TXP_BS_PHASE2_COMMITTED);

  /* a commit with a rolled-back (or rollback-attempted) branch likewise */
  int rolled[] = {TXP_BS_PHASE2_ROLLBACKED};
  assert_int_equal(tc_adm_plan_repair(TC_ADM_COMMIT, "x:3", TXP_GS_BEGIN, rolled, 1, &p, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "PhaseTwoRollbacked"));
  int tried[] = {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE};
  assert_int_equal(tc_adm_plan_repair(TC_ADM_COMMIT, "x:3", TXP_GS_COMMIT_FAILED, tried, 2, &p, err, sizeof(err)), -1);
  int ok[] = {TXP_BS_PHASE2_COMMITTED, TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE};
  assert_int_equal(tc_adm_plan_repair(TC_ADM_COMMIT, "x:3", TXP_GS_COMMIT_FAILED, ok, 2, &p, err, sizeof(err)), 0);
  assert_int_equal(p.nforbid, 3);
  /* a phase-one failure does not stop a commit (that branch has no data) */
  int p1[] = {TXP_BS_PHASE1_FAILED, TXP_BS_PHASE1_DONE};
  assert_int_equal(tc_adm_plan_repair(TC_ADM_COMMIT, "x:3", TXP_GS_BEGIN, p1, 2, &p, err, sizeof(err)), 0);
}

/* Whatever the input, a plan keeps the invariants. */
static void test_plan_invariants(void **state) {
  (void)state;
  int planned = 0, refused = 0;
  for (int kind = TC_ADM_ROLLBACK; kind <= TC_ADM_REDRIVE; kind++) {
    for (int s = -1; s <= TXP_GS__MAX; s++) {
      for (int b = -1; b < TXP_BS__MAX; b++) {
        int bs[1] = {b};
        tc_adm_plan_t p;
        char err[512] = "";
        int rc = tc_adm_plan_repair((tc_adm_kind_t)kind, "x:9", s, bs, b < 0 ? 0 : 1, &p, err, sizeof(err));
        if (rc != 0) {
          assert_true(err[0] != '\0');
          refused++;
          continue;
        }
        planned++;
        assert_int_equal(p.from, s);
        if (p.action == TC_ADM_ACT_DECIDE) {
          assert_int_equal(s, TXP_GS_BEGIN);
          assert_true(txp_global_transition_ok(s, p.to));
        } else {
          assert_true(s != TXP_GS_BEGIN);
          if (p.from != p.to && !txp_global_transition_ok(p.from, p.to))
            fail_msg("%s plans %s -> %s, not a legal edge", tc_adm_kind_name((tc_adm_kind_t)kind),
                     txp_global_status_name(p.from), txp_global_status_name(p.to));
          /* never across the families */
          assert_int_equal(txp_global_status_is_commit(p.from), txp_global_status_is_commit(p.to));
          assert_int_equal(txp_global_status_is_rollback(p.from), txp_global_status_is_rollback(p.to));
        }
        if (kind == TC_ADM_ROLLBACK) assert_false(txp_global_status_is_commit(s));
        if (kind == TC_ADM_COMMIT) assert_false(txp_global_status_is_rollback(s));
        for (int k = 0; k < p.nforbid; k++) assert_int_not_equal(p.forbid[k], b);
        assert_false(txp_global_status_final(p.to) && p.action != TC_ADM_ACT_DECIDE);
      }
    }
  }
  assert_true(planned > 50);
  assert_true(refused > 100);
}

/* ---------------------------------------------------------------- config */

static void test_config_helpers(void **state) {
  (void)state;
  unsigned ids[TC_ADM_MAX_IDS];
  int n;
  char err[256];
  assert_int_equal(tc_adm_parse_ids("", ids, TC_ADM_MAX_IDS, &n, err, sizeof(err)), 0);
  assert_int_equal(n, 0);
  assert_int_equal(tc_adm_parse_ids(" 0, 1000 ,65534\t7", ids, TC_ADM_MAX_IDS, &n, err, sizeof(err)), 0);
  assert_int_equal(n, 4);
  assert_int_equal(ids[0], 0);
  assert_int_equal(ids[1], 1000);
  assert_int_equal(ids[2], 65534);
  assert_int_equal(ids[3], 7);
  assert_int_equal(tc_adm_parse_ids("root", ids, TC_ADM_MAX_IDS, &n, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "\"root\""));
  assert_int_equal(tc_adm_parse_ids("12x", ids, TC_ADM_MAX_IDS, &n, err, sizeof(err)), -1);
  assert_int_equal(tc_adm_parse_ids("-1", ids, TC_ADM_MAX_IDS, &n, err, sizeof(err)), -1);
  assert_int_equal(tc_adm_parse_ids("4294967295", ids, TC_ADM_MAX_IDS, &n, err, sizeof(err)), -1);
  assert_int_equal(tc_adm_parse_ids("1,2,3", ids, 2, &n, err, sizeof(err)), -1);

  unsigned mode;
  assert_int_equal(tc_adm_parse_mode("0600", &mode), 0);
  assert_int_equal(mode, 0600);
  assert_int_equal(tc_adm_parse_mode("660", &mode), 0);
  assert_int_equal(mode, 0660);
  assert_int_equal(tc_adm_parse_mode("0800", &mode), -1);
  assert_int_equal(tc_adm_parse_mode("", &mode), -1);
  assert_int_equal(tc_adm_parse_mode("07777", &mode), -1);
  assert_int_equal(tc_adm_parse_mode("1777", &mode), -1);

  assert_int_equal(tc_adm_check_config("/run/tcd/admin.sock", "", "", "0600", err, sizeof(err)), 0);
  assert_int_equal(tc_adm_check_config("", "", "", "0600", err, sizeof(err)), 0); /* no socket */
  assert_int_equal(tc_adm_check_config("@tcd", "", "", "0600", err, sizeof(err)), -1);
  assert_non_null(strstr(err, "abstract sockets are not supported"));
  char longp[200];
  memset(longp, 'a', sizeof(longp) - 1);
  longp[0] = '/';
  longp[sizeof(longp) - 1] = '\0';
  assert_int_equal(tc_adm_check_config(longp, "", "", "0600", err, sizeof(err)), -1);
  assert_non_null(strstr(err, "at most 107 bytes"));
  assert_int_equal(tc_adm_check_config("/run/tcd/", "", "", "0600", err, sizeof(err)), -1);
  assert_int_equal(tc_adm_check_config("/s", "x", "", "0600", err, sizeof(err)), -1);
  assert_non_null(strstr(err, "admin.allow_uids"));
  assert_int_equal(tc_adm_check_config("/s", "", "y", "0600", err, sizeof(err)), -1);
  assert_non_null(strstr(err, "admin.allow_gids"));
  assert_int_equal(tc_adm_check_config("/s", "", "", "rw", err, sizeof(err)), -1);
  assert_non_null(strstr(err, "admin.socket_mode"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_show_globals),    cmocka_unit_test(test_show_history),
    cmocka_unit_test(test_show_one_and_others),
    cmocka_unit_test(test_repairs),         cmocka_unit_test(test_failpoint_commands),         cmocka_unit_test(test_malformed),
    cmocka_unit_test(test_quote_roundtrip), cmocka_unit_test(test_plan_table),
    cmocka_unit_test(test_refusal_table),
    cmocka_unit_test(test_plan_branch_guards), cmocka_unit_test(test_plan_invariants),
    cmocka_unit_test(test_config_helpers),
  };
  return cmocka_run_group_tests_name("admin_cmd", tests, NULL, NULL);
}
