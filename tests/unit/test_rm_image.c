/*
 * test_rm_image.c - the pure half of the AT resource manager
 * (rm-client/src/at/rm_image.c): row images and their comparison, undo items
 * and their JSON form, lock keys, dirty-write messages, the undo context.
 * Leaks are caught by the ASan build (LeakSanitizer).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rm_client.h"
#include "rm_image.h"
#include "txp_lockkey.h"

/* A row from a NULL-terminated list of name, value pairs; the value
 * pointer NOPE stands for SQL NULL. */
static const char NOPE[] = "<null>";

static rm_row_t *mkrow(const char *name, ...) {
  const char *names[64], *vals[64];
  int n = 0;
  va_list ap;
  va_start(ap, name);
  for (const char *k = name; k; k = va_arg(ap, const char *)) {
    const char *v = va_arg(ap, const char *);
    names[n] = k;
    vals[n] = v == NOPE ? NULL : v;
    n++;
  }
  va_end(ap);
  rm_row_t *r = rm_row_new(n);
  assert_non_null(r);
  for (int i = 0; i < n; i++) assert_int_equal(rm_row_set(r, i, names[i], vals[i]), 0);
  return r;
}

static void assert_rows_equal(const rm_row_t *a, const rm_row_t *b) {
  if (!a || !b) {
    assert_ptr_equal(a, b);
    return;
  }
  assert_int_equal(a->n, b->n);
  /* By name: jsonb does not keep key order. */
  for (int i = 0; i < a->n; i++) {
    int j = rm_row_find(b, a->names[i]);
    assert_true(j >= 0);
    assert_true(rm_val_eq(a->vals[i], b->vals[j]));
  }
}

/* ------------------------------------------------------------------ rows */

static void test_row_basics(void **state) {
  (void)state;
  rm_row_t *r = mkrow("id", "7", "note", "", "gone", NOPE, NULL);
  assert_int_equal(r->n, 3);
  assert_int_equal(rm_row_find(r, "note"), 1);
  assert_int_equal(rm_row_find(r, "nope"), -1);
  assert_int_equal(rm_row_find(NULL, "id"), -1);
  assert_null(r->vals[2]);
  assert_string_equal(r->vals[1], "");
  assert_int_equal(rm_row_set(r, 3, "x", "y"), RM_E_INVALID);
  assert_int_equal(rm_row_set(r, 0, NULL, "y"), RM_E_INVALID);
  rm_row_t *d = rm_row_dup(r);
  assert_rows_equal(r, d);
  assert_ptr_not_equal(d->vals[0], r->vals[0]);
  assert_int_equal(rm_row_set(d, 0, "id", "8"), 0); /* overwrite frees the old copy */
  assert_string_equal(r->vals[0], "7");
  rm_row_free(d);
  rm_row_free(r);
  rm_row_free(NULL);
  assert_null(rm_row_dup(NULL));
  assert_null(rm_row_new(-1));
  rm_row_t *e = rm_row_new(0);
  assert_non_null(e);
  rm_row_free(e);
}

static void test_val_eq(void **state) {
  (void)state;
  assert_true(rm_val_eq(NULL, NULL));
  assert_false(rm_val_eq(NULL, ""));
  assert_false(rm_val_eq("", NULL));
  assert_true(rm_val_eq("", ""));
  assert_true(rm_val_eq("a", "a"));
  assert_false(rm_val_eq("a", "A"));
  assert_false(rm_val_eq("1", "1 "));
}

static void test_row_diff(void **state) {
  (void)state;
  rm_row_t *after = mkrow("id", "1", "status", "UNPAID", "note", NOPE, "qty", "2", NULL);
  rm_row_t *same = mkrow("qty", "2", "id", "1", "note", NOPE, "status", "UNPAID", NULL);
  int diff[8];
  assert_int_equal(rm_row_diff(after, same, diff, 8), 0);

  /* NULL is not "", and a changed value is a difference. */
  rm_row_t *cur = mkrow("id", "1", "status", "PAID", "note", "", "qty", "2", NULL);
  assert_int_equal(rm_row_diff(after, cur, diff, 8), 2);
  assert_int_equal(diff[0], 1);
  assert_int_equal(diff[1], 2);
  /* The count is total even when 'diff' is short. */
  assert_int_equal(rm_row_diff(after, cur, diff, 1), 2);
  assert_int_equal(diff[0], 1);
  assert_int_equal(rm_row_diff(after, cur, NULL, 0), 2);

  /* A column the current row lacks differs; one it adds is ignored. */
  rm_row_t *fewer = mkrow("id", "1", "status", "UNPAID", "note", NOPE, NULL);
  assert_int_equal(rm_row_diff(after, fewer, diff, 8), 1);
  assert_int_equal(diff[0], 3);
  rm_row_t *more = mkrow("id", "1", "status", "UNPAID", "note", NOPE, "qty", "2", "new", "x", NULL);
  assert_int_equal(rm_row_diff(after, more, diff, 8), 0);
  /* No current row at all: every column differs. */
  assert_int_equal(rm_row_diff(after, NULL, NULL, 0), 4);
  assert_int_equal(rm_row_diff(NULL, cur, NULL, 0), 0);

  rm_row_free(after);
  rm_row_free(same);
  rm_row_free(cur);
  rm_row_free(fewer);
  rm_row_free(more);
}

/* ----------------------------------------------------------------- items */

static rm_item_t mkitem(rm_op_t op) {
  rm_item_t it = {0};
  it.op = op;
  it.schema = strdup("public");
  it.table = strdup("trade_order");
  it.pk = mkrow("order_id", "1001", NULL);
  if (op == RM_OP_UPDATE || op == RM_OP_DELETE)
    it.before = mkrow("order_id", "1001", "status", "UNPAID", "note", NOPE, NULL);
  if (op == RM_OP_UPDATE || op == RM_OP_INSERT)
    it.after = mkrow("order_id", "1001", "status", "PAID \"quoted\" \xc3\xa9", "note", "", NULL);
  if (op == RM_OP_DELTA || op == RM_OP_COMMIT_DELTA) {
    it.col = strdup("frozen_count");
    it.delta = op == RM_OP_DELTA ? -9223372036854775807LL : -2;
  }
  return it;
}

static void assert_items_equal(const rm_item_t *a, const rm_item_t *b) {
  assert_int_equal(a->op, b->op);
  assert_string_equal(a->schema, b->schema);
  assert_string_equal(a->table, b->table);
  assert_rows_equal(a->pk, b->pk);
  assert_rows_equal(a->before, b->before);
  assert_rows_equal(a->after, b->after);
  if (a->op == RM_OP_DELTA || a->op == RM_OP_COMMIT_DELTA) {
    assert_string_equal(a->col, b->col);
    assert_true(a->delta == b->delta);
  }
}

/* Decode 'text', which must give the 'n' items 'want'; the items decoded
 * (free with rm_undo_free). */
static rm_item_t *decode_as(const char *text, const rm_item_t *want, size_t n) {
  rm_item_t *out = NULL;
  size_t got = 0;
  char err[256];
  assert_int_equal(rm_undo_decode(text, &out, &got, err, sizeof(err)), 0);
  assert_int_equal(got, n);
  for (size_t i = 0; i < n; i++) assert_items_equal(&want[i], &out[i]);
  return out;
}

static void test_undo_roundtrip(void **state) {
  (void)state;
  rm_item_t items[5] = {mkitem(RM_OP_INSERT), mkitem(RM_OP_UPDATE), mkitem(RM_OP_DELETE), mkitem(RM_OP_DELTA),
                        mkitem(RM_OP_COMMIT_DELTA)};
  /* The in-memory schema of another item, written last in the compact form. */
  free(items[2].schema);
  items[2].schema = strdup("sales");
  char *text = rm_undo_encode(items, 5);
  assert_non_null(text);
  /* The documented shape: compact items, "public" left out. */
  assert_non_null(strstr(text, "[[\"i\",\"trade_order\",{\"order_id\":\"1001\"},{"));
  assert_non_null(strstr(text, "[\"u\",\"trade_order\",{\"order_id\":\"1001\"},{"));
  assert_non_null(strstr(text, "},\"sales\"],[\"d\",\"trade_order\",{\"order_id\":\"1001\"},\"frozen_count\",-9223372036854775807]"));
  assert_non_null(strstr(text, "[\"c\",\"trade_order\",{\"order_id\":\"1001\"},\"frozen_count\",-2]]"));
  assert_non_null(strstr(text, "\"note\":null"));
  assert_null(strstr(text, "public"));
  assert_null(strstr(text, "\"op\""));

  /* RM_UNDO_OBJECTS: the object form, which earlier versions read. */
  json_t *objects = json_array();
  for (int i = 0; i < 5; i++) assert_int_equal(json_array_append_new(objects, rm_item_to_json(&items[i])), 0);
  char *again = json_dumps(objects, JSON_COMPACT);
  assert_non_null(again);
  assert_non_null(strstr(again, "[{\"op\":\"insert\",\"schema\":\"public\",\"table\":\"trade_order\""));
  assert_non_null(strstr(again, "\"op\":\"commit_delta\""));
  json_decref(objects);
  /* ... and decodes to the same items, as the compact text does. */
  rm_undo_free(decode_as(again, items, 5), 5);
  free(again);

  size_t n = 5;
  rm_item_t *out = decode_as(text, items, n);
  /* Images that were absent stay absent. */
  assert_null(out[0].before);
  assert_null(out[2].after);
  assert_null(out[3].before);
  assert_null(out[4].before);
  assert_null(out[4].after);
  assert_string_equal(rm_op_name(RM_OP_COMMIT_DELTA), "commit_delta");
  rm_undo_free(out, n);
  free(text);
  for (int i = 0; i < 5; i++) rm_item_clear(&items[i]);
  rm_item_clear(NULL);
}

/* Decode 'text', which must hold one item of 'op' (free with rm_undo_free(.., 1)). */
static rm_item_t *decode_one(const char *text, rm_op_t op) {
  rm_item_t *out = NULL;
  size_t n = 0;
  char err[256];
  assert_int_equal(rm_undo_decode(text, &out, &n, err, sizeof(err)), 0);
  assert_int_equal(n, 1);
  assert_int_equal(out[0].op, op);
  return out;
}

/* What jsonb hands back: keys reordered, whitespace added. */
static void test_undo_decode_jsonb_order(void **state) {
  (void)state;
  const char *text =
    "[{\"pk\": {\"b\": \"2\", \"a\": \"1\"}, \"op\": \"update\", \"after\": {\"a\": \"1\", \"b\": \"2\", "
    "\"v\": \"y\"}, \"table\": \"t\", \"before\": {\"v\": null, \"a\": \"1\", \"b\": \"2\"}, "
    "\"schema\": \"s\"}]";
  rm_item_t *out = decode_one(text, RM_OP_UPDATE);
  assert_string_equal(out[0].schema, "s");
  assert_int_equal(out[0].pk->n, 2);
  int v = rm_row_find(out[0].before, "v");
  assert_true(v >= 0);
  assert_null(out[0].before->vals[v]);
  rm_undo_free(out, 1);
}

#define DIGEST_16 "0123456789abcdef"
#define DIGEST_129 DIGEST_16 DIGEST_16 DIGEST_16 DIGEST_16 DIGEST_16 DIGEST_16 DIGEST_16 DIGEST_16 "x"

/* An insert as the library writes it: key and digest, no image; encoded
 * and decoded back. */
static void test_undo_insert_digest(void **state) {
  (void)state;
  rm_item_t it = {.op = RM_OP_INSERT, .schema = strdup("public"), .table = strdup("t"), .pk = rm_row_new(1),
                  .digest = strdup("q1w2e3r4t5y6u7i8o9p0a1s2d3f4g5h6j7k8l9z0x1c=")};
  assert_int_equal(rm_row_set(it.pk, 0, "id", "42"), 0);
  char *text = rm_undo_encode(&it, 1);
  assert_non_null(text);
  /* The compact form keeps the digest's first RM_ROW_DIGEST_KEPT characters. */
  assert_string_equal(text, "[[\"i\",\"t\",{\"id\":\"42\"},\"q1w2e3r4t5y6u7i8o9p0a1\"]]");
  rm_item_t *out = decode_one(text, RM_OP_INSERT);
  assert_string_equal(out[0].schema, "public");
  assert_string_equal(out[0].digest, "q1w2e3r4t5y6u7i8o9p0a1");
  assert_null(out[0].after);
  /* The rollback compares that head with the row's whole digest now. */
  assert_true(rm_digest_matches(out[0].digest, it.digest));
  assert_true(rm_digest_matches(it.digest, it.digest)); /* a whole one, as earlier versions kept it */
  assert_false(rm_digest_matches(out[0].digest, "q1w2e3r4t5y6u7i8o9p0aXs2d3f4g5h6j7k8l9z0x1c="));
  assert_false(rm_digest_matches(out[0].digest, "q1w2e3r4t5y6u7i8o9p0a"));
  assert_false(rm_digest_matches("q1w2e3r4t5", it.digest)); /* too short a head proves nothing */
  assert_false(rm_digest_matches(NULL, it.digest));
  /* A digest too short to keep is refused, not cut to nothing. */
  rm_item_t short_digest = {.op = RM_OP_INSERT, .schema = strdup("public"), .table = strdup("t"), .pk = rm_row_new(1),
                            .digest = strdup("q1w2e3r4t5")};
  assert_int_equal(rm_row_set(short_digest.pk, 0, "id", "42"), 0);
  assert_null(rm_item_to_compact(&short_digest));
  rm_item_clear(&short_digest);
  /* The message of a dirty one shows the row as it is now. */
  rm_row_t *cur = rm_row_new(2);
  assert_int_equal(rm_row_set(cur, 0, "id", "42"), 0);
  assert_int_equal(rm_row_set(cur, 1, "v", "changed"), 0);
  char msg[512];
  rm_dirty_message(msg, sizeof(msg), &out[0], "after", NULL, cur, NULL, 0);
  assert_non_null(strstr(msg, "changed since the branch inserted it"));
  assert_non_null(strstr(msg, "v \"changed\""));
  rm_row_free(cur);
  rm_undo_free(out, 1);
  free(text);
  rm_item_clear(&it);
  /* Earlier versions' inserts, with their after image, still decode. */
  out = decode_one("[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},"
                   "\"after\":{\"id\":\"1\"}}]", RM_OP_INSERT);
  assert_non_null(out[0].after);
  assert_null(out[0].digest);
  rm_undo_free(out, 1);
}

static void test_undo_decode_errors(void **state) {
  (void)state;
  static const char *const bad[] = {
    NULL,
    "",
    "not json",
    "{}",
    "[]",
    "[1]",
    "[{\"op\":\"upsert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"}}]",
    "[{\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"after\":{}}]",
    "[{\"op\":\"insert\",\"schema\":\"s\",\"pk\":{\"id\":\"1\"},\"after\":{}}]",
    "[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"\",\"pk\":{\"id\":\"1\"},\"after\":{}}]",
    "[{\"op\":\"insert\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"after\":{}}]",
    "[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{},\"after\":{}}]",
    "[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":null},\"after\":{}}]",
    "[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":1},\"after\":{}}]",
    "[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"}}]",
    "[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"digest\":\"\"}]",
    "[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"digest\":7}]",
    "[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"digest\":\"" DIGEST_129 "\"}]",
    "[{\"op\":\"update\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"after\":{}}]",
    "[{\"op\":\"delete\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"before\":[]}]",
    "[{\"op\":\"update\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"before\":{\"x\":2},"
    "\"after\":{}}]",
    "[{\"op\":\"delta\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"col\":\"c\"}]",
    "[{\"op\":\"delta\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"col\":\"c\",\"delta\":1.5}]",
    "[{\"op\":\"delta\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"delta\":1}]",
    /* duplicate keys are refused, not silently merged */
    "[{\"op\":\"delta\",\"op\":\"delta\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},"
    "\"col\":\"c\",\"delta\":1}]",
    /* a good item followed by a bad one: nothing is returned */
    "[{\"op\":\"delta\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"col\":\"c\",\"delta\":1},"
    "{\"op\":\"delta\"}]",
    /* a digest too short to tell anything (26) */
    "[{\"op\":\"insert\",\"schema\":\"s\",\"table\":\"t\",\"pk\":{\"id\":\"1\"},\"digest\":\"0123456789\"}]",
    /* the compact form (27-) */
    "[[]]",
    "[[\"q\",\"t\",{\"id\":\"1\"},\"0123456789012345678901\"]]",
    "[[\"i\",\"t\",{\"id\":\"1\"}]]",
    "[[\"i\",\"t\",{\"id\":\"1\"},\"0123456789\"]]",
    "[[\"i\",\"\",{\"id\":\"1\"},\"0123456789012345678901\"]]",
    "[[\"i\",\"t\",{},\"0123456789012345678901\"]]",
    "[[\"i\",\"t\",{\"id\":\"1\"},\"0123456789012345678901\",\"\"]]",
    "[[\"i\",\"t\",{\"id\":\"1\"},\"0123456789012345678901\",\"s\",\"extra\"]]",
    "[[\"i\",\"t\",{\"id\":\"1\"},7]]",
    "[[\"u\",\"t\",{\"id\":\"1\"},{}]]",
    "[[\"u\",\"t\",{\"id\":\"1\"},{},[]]]",
    "[[\"x\",\"t\",{\"id\":\"1\"},\"row\"]]",
    "[[\"d\",\"t\",{\"id\":\"1\"},\"c\",1.5]]",
    "[[\"d\",\"t\",{\"id\":\"1\"},\"\",1]]",
    "[[\"c\",\"t\",{\"id\":\"1\"},\"c\"]]",
    "[[\"d\",\"t\",{\"id\":\"1\"},\"c\",1],7]",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    rm_item_t *out = (rm_item_t *)(uintptr_t)1;
    size_t n = 99;
    char err[256] = "";
    int rc = rm_undo_decode(bad[i], &out, &n, err, sizeof(err));
    if (rc != RM_E_INVALID) fail_msg("case %zu (%s): rc %d", i, bad[i] ? bad[i] : "NULL", rc);
    assert_null(out);
    assert_int_equal(n, 0);
    assert_true(err[0] != '\0');
  }
  /* The reason names the item and the field. */
  rm_item_t *out;
  size_t n;
  char err[256];
  rm_undo_decode(bad[23], &out, &n, err, sizeof(err));
  assert_non_null(strstr(err, "\"col\""));
  rm_undo_decode(bad[17], &out, &n, err, sizeof(err));
  assert_non_null(strstr(err, "digest is 129 bytes long"));
  rm_undo_decode(bad[26], &out, &n, err, sizeof(err));
  assert_non_null(strstr(err, "digest is 10 bytes long"));
  rm_undo_decode(bad[29], &out, &n, err, sizeof(err));
  assert_non_null(strstr(err, "has 3 elements, not 4 or 5"));
  rm_undo_decode(bad[30], &out, &n, err, sizeof(err));
  assert_non_null(strstr(err, "digest is 10 bytes long"));
}

static void test_item_to_json_refuses(void **state) {
  (void)state;
  rm_item_t it = mkitem(RM_OP_INSERT);
  /* Not UTF-8: refused rather than written as something else. */
  assert_int_equal(rm_row_set(it.after, 1, "status", "\xff\xfe"), 0);
  assert_null(rm_item_to_json(&it));
  rm_item_t items[1] = {it};
  assert_null(rm_undo_encode(items, 1));
  rm_item_clear(&it);
  /* Incomplete items. */
  rm_item_t empty = {0};
  assert_null(rm_item_to_json(&empty));
  assert_null(rm_item_to_json(NULL));
  rm_item_t d = mkitem(RM_OP_DELTA);
  free(d.col);
  d.col = NULL;
  assert_null(rm_item_to_json(&d));
  rm_item_clear(&d);
  assert_string_equal(rm_op_name(RM_OP_DELETE), "delete");
  assert_string_equal(rm_op_name((rm_op_t)42), "unknown");
}

/* ------------------------------------------------------------- lock keys */

static void expect_pk(const char *want, int n, ...) {
  const char *vals[8];
  va_list ap;
  va_start(ap, n);
  for (int i = 0; i < n; i++) vals[i] = va_arg(ap, const char *);
  va_end(ap);
  char out[256];
  int len = rm_lockkey_pk(vals, n, out, sizeof(out));
  if (len < 0) fail_msg("rm_lockkey_pk failed for \"%s\": %d", want, len);
  assert_string_equal(out, want);
  assert_int_equal(len, (int)strlen(want));
  /* Whatever the input, the result is a usable lock key part. */
  assert_true(txp_lockkey_part_ok(out, strlen(out)));
}

static void test_lockkey_pk(void **state) {
  (void)state;
  expect_pk("1001", 1, "1001");
  expect_pk("a_b", 1, "a_b"); /* single key: '_' needs no escaping */
  expect_pk("7_1_0", 3, "7", "1", "0");
  expect_pk("hello world.x", 1, "hello world.x");
  /* Forbidden bytes, empty values and the escape prefix itself: hex. */
  expect_pk("\\x613a62", 1, "a:b");
  expect_pk("\\x612c62", 1, "a,b");
  expect_pk("\\x613b62", 1, "a;b");
  expect_pk("\\x5e", 1, "^");
  expect_pk("\\x0a", 1, "\n");
  expect_pk("\\x", 1, "");
  expect_pk("\\x5c7841", 1, "\\xA");
  expect_pk("\xc3\xa9t\xc3\xa9", 1, "\xc3\xa9t\xc3\xa9"); /* UTF-8 is fine as it is */
  /* Composite keys: a value holding '_' is hex, so joins stay unambiguous. */
  expect_pk("\\x615f62_c", 2, "a_b", "c");
  expect_pk("a_\\x625f63", 2, "a", "b_c");
  expect_pk("\\x_x", 2, "", "x");
}

static void test_lockkey_pk_errors(void **state) {
  (void)state;
  char out[16];
  const char *one[1] = {"1"};
  const char *withnull[2] = {"1", NULL};
  assert_int_equal(rm_lockkey_pk(NULL, 1, out, sizeof(out)), RM_E_INVALID);
  assert_int_equal(rm_lockkey_pk(one, 0, out, sizeof(out)), RM_E_INVALID);
  assert_int_equal(rm_lockkey_pk(one, 1, NULL, 16), RM_E_INVALID);
  assert_int_equal(rm_lockkey_pk(one, 1, out, 0), RM_E_INVALID);
  assert_int_equal(rm_lockkey_pk(withnull, 2, out, sizeof(out)), RM_E_INVALID);
  /* Exactly fitting vs one byte short (the NUL needs room). */
  const char *fit[1] = {"123456789012345"};
  assert_int_equal(rm_lockkey_pk(fit, 1, out, sizeof(out)), 15);
  const char *over[1] = {"1234567890123456"};
  assert_int_equal(rm_lockkey_pk(over, 1, out, sizeof(out)), RM_E_INVALID);
  const char *hexover[1] = {"a:bcdef"}; /* 2 + 14 = 16 bytes */
  assert_int_equal(rm_lockkey_pk(hexover, 1, out, sizeof(out)), RM_E_INVALID);
}

static void test_lockkeys_add(void **state) {
  (void)state;
  txp_buf_t b;
  txp_buf_init(&b, 0);
  const char *k1[1] = {"1001"}, *k2[3] = {"7", "1", "0"}, *k3[1] = {"x;y"};
  assert_int_equal(rm_lockkeys_add(&b, "orders", "trade_order", k1, 1), 0);
  assert_int_equal(rm_lockkeys_add(&b, "orders", "activity_ticket_bucket", k2, 3), 0);
  assert_int_equal(rm_lockkeys_add(&b, "orders", "s.t", k3, 1), 0);
  assert_string_equal(b.data, "trade_order:1001;activity_ticket_bucket:7_1_0;s.t:\\x783b79");
  /* The TC parses what we built back into the same keys. */
  assert_int_equal(txp_lockkeys_count(b.data, 100), 3);

  /* Refusals leave the buffer as it was. */
  size_t len = b.len;
  assert_int_equal(rm_lockkeys_add(&b, "orders", "bad:table", k1, 1), RM_E_INVALID);
  assert_int_equal(rm_lockkeys_add(&b, "orders", "", k1, 1), RM_E_INVALID);
  assert_int_equal(rm_lockkeys_add(&b, "orders", "t", NULL, 1), RM_E_INVALID);
  assert_int_equal(rm_lockkeys_add(NULL, "orders", "t", k1, 1), RM_E_INVALID);
  /* A row key (resource^^^table^^^pk) over TXP_MAX_ROW_KEY_LEN. */
  char *big = malloc(TXP_MAX_ROW_KEY_LEN + 1);
  assert_non_null(big);
  size_t room = TXP_MAX_ROW_KEY_LEN - strlen("orders") - 6 - strlen("t");
  memset(big, 'k', room);
  big[room] = '\0';
  const char *kb[1] = {big};
  assert_int_equal(rm_lockkeys_add(&b, "orders", "t", kb, 1), 0); /* exactly at the limit */
  len = b.len;
  big[room] = 'k';
  big[room + 1] = '\0';
  assert_int_equal(rm_lockkeys_add(&b, "orders", "t", kb, 1), RM_E_INVALID);
  assert_int_equal(b.len, len);
  free(big);
  txp_buf_free(&b);

  /* A bounded buffer (the branch's 64 KiB of lock keys) that is full. */
  txp_buf_init(&b, 32);
  assert_int_equal(rm_lockkeys_add(&b, "r", "t", k1, 1), 0);
  assert_int_equal(rm_lockkeys_add(&b, "r", "t", k1, 1), 0);
  assert_int_equal(rm_lockkeys_add(&b, "r", "t", k1, 1), 0);
  assert_int_equal(rm_lockkeys_add(&b, "r", "t", k1, 1), 0);
  assert_int_equal(rm_lockkeys_add(&b, "r", "t", k1, 1), RM_E_INVALID);
  assert_int_equal(b.len, 27);
  assert_string_equal(b.data, "t:1001;t:1001;t:1001;t:1001"); /* still a C string */
  txp_buf_free(&b);
}

/* -------------------------------------------------------- dirty messages */

static void test_dirty_message(void **state) {
  (void)state;
  rm_item_t it = mkitem(RM_OP_UPDATE);
  rm_row_t *cur = mkrow("order_id", "1001", "status", "CANCELLED", "note", "by hand", NULL);
  int diff[8];
  int nd = rm_row_diff(it.after, cur, diff, 8);
  assert_int_equal(nd, 2);
  char msg[1024];
  rm_dirty_message(msg, sizeof(msg), &it, "after", it.after, cur, diff, nd);
  assert_non_null(strstr(msg, "dirty write on \"public\".\"trade_order\" key (order_id)=(\"1001\")"));
  assert_non_null(strstr(msg, "2 columns changed"));
  assert_non_null(strstr(msg, "status after \"PAID \"quoted\" \xc3\xa9\", now \"CANCELLED\""));
  assert_non_null(strstr(msg, "note after \"\", now \"by hand\""));
  assert_non_null(strstr(msg, "nothing was overwritten"));

  /* NULL values, long values shortened. */
  char longv[200];
  memset(longv, 'v', sizeof(longv) - 1);
  longv[sizeof(longv) - 1] = '\0';
  assert_int_equal(rm_row_set(cur, 2, "note", longv), 0);
  assert_int_equal(rm_row_set(it.after, 2, "note", NULL), 0);
  nd = rm_row_diff(it.after, cur, diff, 8);
  rm_dirty_message(msg, sizeof(msg), &it, "after", it.after, cur, diff, nd);
  assert_non_null(strstr(msg, "note after NULL, now \"vvvv"));
  assert_non_null(strstr(msg, "...\""));
  assert_null(strstr(msg, longv));

  /* Row gone; row present when it should not be. */
  rm_dirty_message(msg, sizeof(msg), &it, "after", it.after, NULL, NULL, 0);
  assert_non_null(strstr(msg, "the row was deleted since the branch"));
  rm_dirty_message(msg, sizeof(msg), &it, "before", NULL, cur, NULL, 0);
  assert_non_null(strstr(msg, "a row exists"));

  /* Composite keys name every key column. */
  rm_row_free(it.pk);
  it.pk = mkrow("activity_id", "7", "ticket_type", "1", "bucket_id", "0", NULL);
  rm_dirty_message(msg, sizeof(msg), &it, "after", it.after, NULL, NULL, 0);
  assert_non_null(strstr(msg, "key (activity_id, ticket_type, bucket_id)=(\"7\", \"1\", \"0\")"));

  /* A small buffer is truncated, never overrun, always terminated. */
  for (size_t cap = 1; cap < 40; cap++) {
    char small[40];
    memset(small, 'Z', sizeof(small));
    rm_dirty_message(small, cap, &it, "after", it.after, cur, diff, nd);
    assert_int_equal(strlen(small), cap - 1);
    assert_int_equal(small[cap], 'Z');
  }
  rm_row_free(cur);
  rm_item_clear(&it);
}

/* ---------------------------------------------------------------- context */

static void test_ctx_roundtrip(void **state) {
  (void)state;
  const char *names[4] = {"TimeZone", "DateStyle", "weird", "skipped"};
  const char *values[4] = {"Europe/Paris", "ISO, MDY", "a;b=c%d\n", NULL};
  char *s = rm_ctx_format(true, false, true, 4, names, values);
  assert_non_null(s);
  assert_string_equal(s, "serializer=json;version=3;delta=1;TimeZone=Europe/Paris;DateStyle=ISO, MDY;"
                         "weird=a%3Bb%3Dc%25d%0A");
  rm_ctx_t ctx;
  assert_int_equal(rm_ctx_parse(s, &ctx), 0);
  assert_true(ctx.delta);
  assert_int_equal(ctx.version, 3);
  /* The three written, then the standard ones left out put back. */
  assert_int_equal(ctx.nsettings, 7);
  assert_string_equal(ctx.names[0], "TimeZone");
  assert_string_equal(ctx.values[0], "Europe/Paris");
  assert_string_equal(ctx.values[1], "ISO, MDY");
  assert_string_equal(ctx.values[2], "a;b=c%d\n");
  assert_string_equal(ctx.names[3], "IntervalStyle");
  assert_string_equal(ctx.values[3], RM_CTX_STD_INTERVALSTYLE);
  assert_string_equal(ctx.names[6], "lc_monetary");
  assert_string_equal(ctx.values[6], RM_CTX_STD_LC_MONETARY);
  rm_ctx_clear(&ctx);
  free(s);

  s = rm_ctx_format(false, false, true, 0, NULL, NULL);
  assert_string_equal(s, "serializer=json;version=3");
  assert_int_equal(rm_ctx_parse(s, &ctx), 0);
  assert_false(ctx.delta);
  assert_false(ctx.commit);
  assert_int_equal(ctx.nsettings, 6);
  assert_string_equal(ctx.names[0], "TimeZone");
  assert_string_equal(ctx.values[0], RM_CTX_STD_TIMEZONE);
  assert_string_equal(ctx.names[1], "DateStyle");
  assert_string_equal(ctx.values[1], RM_CTX_STD_DATESTYLE);
  rm_ctx_clear(&ctx);
  free(s);

  /* Commit deltas: the mark the SQL of rm_undo.c looks for. */
  const char *tz[1] = {"TimeZone"}, *tzv[1] = {"commit=1;"};
  s = rm_ctx_format(true, true, true, 1, tz, tzv);
  assert_string_equal(s, "serializer=json;version=3;delta=1;commit=1;TimeZone=commit%3D1%3B");
  assert_int_equal(rm_ctx_parse(s, &ctx), 0);
  assert_true(ctx.commit);
  assert_int_equal(ctx.version, 3);
  assert_int_equal(ctx.nsettings, 6);
  assert_string_equal(ctx.values[0], "commit=1;");
  rm_ctx_clear(&ctx);
  free(s);

  /* RM_UNDO_OBJECTS: the versions of before, every setting written. */
  s = rm_ctx_format(true, false, false, 1, tz, tzv);
  assert_string_equal(s, "serializer=json;version=1;delta=1;TimeZone=commit%3D1%3B");
  free(s);
  s = rm_ctx_format(false, true, false, 0, NULL, NULL);
  assert_string_equal(s, "serializer=json;version=2;commit=1");
  free(s);

  /* Earlier versions read as they were written: nothing put back. */
  assert_int_equal(rm_ctx_parse("serializer=json;version=1;delta=1;TimeZone=UTC", &ctx), 0);
  assert_int_equal(ctx.version, 1);
  assert_int_equal(ctx.nsettings, 1);
  rm_ctx_clear(&ctx);
  assert_int_equal(rm_ctx_parse("serializer=json;version=2;commit=1", &ctx), 0);
  assert_true(ctx.commit);
  assert_int_equal(ctx.nsettings, 0);
  rm_ctx_clear(&ctx);
}

static void test_ctx_errors(void **state) {
  (void)state;
  static const char *const bad[] = {
    NULL,
    "",
    "guard",
    "serializer=jackson;version=1",
    "serializer=json",
    "serializer=json;version=2",
    "serializer=json;version=4",
    "serializer=json;version=1;commit=1",
    "serializer=json;version=2;commit=0",
    "serializer=json;version=1;=x",
    "serializer=json;version=1;TimeZone",
    "serializer=json;version=1;TimeZone=%4",
    "serializer=json;version=1;TimeZone=%zz",
    "serializer=json;version=1;TimeZone=%00",
    "serializer=json;version=1;a=1;b=1;c=1;d=1;e=1;f=1;g=1;h=1;i=1",
    /* version 3: three of one's own and the six standard ones put back */
    "serializer=json;version=3;a=1;b=1;c=1",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    rm_ctx_t ctx;
    if (rm_ctx_parse(bad[i], &ctx) != RM_E_INVALID) fail_msg("case %zu accepted", i);
    assert_int_equal(ctx.nsettings, 0);
  }
  rm_ctx_t ctx;
  assert_int_equal(rm_ctx_parse("version=1;serializer=json;x=%41", &ctx), 0);
  assert_string_equal(ctx.values[0], "A");
  rm_ctx_clear(&ctx);
  rm_ctx_clear(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_row_basics),
    cmocka_unit_test(test_val_eq),
    cmocka_unit_test(test_row_diff),
    cmocka_unit_test(test_undo_roundtrip),
    cmocka_unit_test(test_undo_decode_jsonb_order),
    cmocka_unit_test(test_undo_insert_digest),
    cmocka_unit_test(test_undo_decode_errors),
    cmocka_unit_test(test_item_to_json_refuses),
    cmocka_unit_test(test_lockkey_pk),
    cmocka_unit_test(test_lockkey_pk_errors),
    cmocka_unit_test(test_lockkeys_add),
    cmocka_unit_test(test_dirty_message),
    cmocka_unit_test(test_ctx_roundtrip),
    cmocka_unit_test(test_ctx_errors),
  };
  return cmocka_run_group_tests_name("rm_image", tests, NULL, NULL);
}
