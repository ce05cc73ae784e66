/*
 * rm_image.h - the pure half of the AT resource manager: row images,
 * undo items and their JSON form, image comparison, lock keys and the undo
 * context string.  No libpq, no threads, no I/O: everything here is unit
 * tested on its own (tests/unit/test_rm_image.c).
 *
 * NOTES
 *   A row image is an ordered map from column name to text value, exactly
 *   as PostgreSQL's text output gave it; a NULL value is SQL NULL and is
 *   distinct from "".  Images are compared as text: the phase-two
 *   connection adopts the session settings that shaped the text (TimeZone,
 *   DateStyle, ... recorded in the undo context), so equal values print
 *   equally.
 *
 *   The undo of a branch (undo_log.rollback_info) is a JSON array of items
 *   in the order the statements ran; rollback replays it backwards.  The
 *   library writes each item in its compact form (context version 3): an
 *   array, the op's one-letter code, the table, the key, what the op needs,
 *   and the schema last only when it is not "public":
 *
 *     ["i", t, {pk}, digest]          ["i", t, {pk}, {after}]
 *     ["u", t, {pk}, {before}, {after}]
 *     ["x", t, {pk}, {before}]        (delete)
 *     ["d", t, {pk}, col, n]          ["c", t, {pk}, col, n] (commit_delta)
 *
 *   About half the bytes of the object form (no key names, no "public"),
 *   which every undo row pays twice in WAL (its insert, then its pages'
 *   deletes and vacuum).  The object form, which earlier versions wrote
 *   (and RM_UNDO_OBJECTS still does), reads as well:
 *
 *     {"op":"insert","schema":s,"table":t,"pk":{col:val,...},"digest":d}
 *     {"op":"insert","schema":s,"table":t,"pk":{col:val,...},"after":{...}}
 *     {"op":"update","schema":s,"table":t,"pk":{...},"before":{...},"after":{...}}
 *     {"op":"delete","schema":s,"table":t,"pk":{...},"before":{...}}
 *     {"op":"delta", "schema":s,"table":t,"pk":{...},"col":c,"delta":n}
 *     {"op":"commit_delta","schema":s,"table":t,"pk":{...},"col":c,"delta":n}
 *
 *   An insert's "digest" (RM_AT_ROW_DIGEST: the SHA-256 of the row's text
 *   form, base64) stands for its whole after image: the rollback deletes
 *   the row only if it still has that digest.  The compact form keeps its
 *   first RM_ROW_DIGEST_KEPT characters (132 bits: enough to tell a row
 *   that changed, which is all it is for; the rows are the RM's own, not
 *   an adversary's choice), and the rollback compares that head.  It is what the library
 *   writes (a few dozen bytes instead of the row, in the undo row and its
 *   WAL); an "after" image, as earlier versions wrote it, still rolls back
 *   as before.  What a digest cannot tell is which columns changed, so a
 *   dirty insert's message shows the row as it is now; and a column added
 *   to the table after the insert makes its rollback dirty (an image would
 *   have ignored the new column): the operator repairs as for any dirty
 *   undo.
 *
 *   A "delta" item was applied in phase one (col + n, n >= 0) and is undone
 *   by col - n; a "commit_delta" item was not applied yet: phase-two commit
 *   applies it (col + n), rollback drops it.
 *
 *   Image values are JSON strings or null.  "pk" holds the primary key
 *   columns (undo_log stores jsonb, which does not keep key order, so the
 *   key order is not relied upon after a round trip).
 *
 *   Lock keys follow proto/txp_lockkey.h: "table:pk" where a composite key
 *   joins its values with '_'.  A value is written as "\x" + hex of its
 *   bytes when it could not be written plainly or could be misread: when it
 *   is empty, holds a byte txp_lockkey_part_ok() refuses, starts with "\x",
 *   or (composite keys only) holds '_'.  The encoding is therefore
 *   injective: two different keys never share a lock key.
 */
#ifndef RM_IMAGE_H
#define RM_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "txp_msg.h"

/* A row image: 'n' columns, names and values owned by the row. */
typedef struct rm_row {
  int n;
  char **names;
  char **vals; /* vals[i] == NULL: SQL NULL */
} rm_row_t;

/* New row of 'n' (>= 0) unset columns (names NULL until set).  NULL on
 * allocation failure. */
rm_row_t *rm_row_new(int n);
void rm_row_free(rm_row_t *r);
/* Set column 'i' to a copy of 'name' / 'val' (val may be NULL).  0 or
 * RM_E_NOMEM. */
int rm_row_set(rm_row_t *r, int i, const char *name, const char *val);
/* Index of column 'name', or -1. */
int rm_row_find(const rm_row_t *r, const char *name);
/* Deep copy, NULL on allocation failure (or when 'r' is NULL). */
rm_row_t *rm_row_dup(const rm_row_t *r);

/* Whether two values are equal: both NULL, or both non-NULL and equal. */
bool rm_val_eq(const char *a, const char *b);

/*
 * Compare the columns of 'image' with the same-named columns of 'cur'.  A
 * column of 'image' that 'cur' lacks counts as different; columns only in
 * 'cur' (added to the table since the image) are ignored.  Writes the
 * indexes (into 'image') of up to 'cap' differing columns to 'diff' (may
 * be NULL when cap is 0) and returns how many columns differ in total.
 */
int rm_row_diff(const rm_row_t *image, const rm_row_t *cur, int *diff, int cap);

/* RM_OP_COMMIT_DELTA is not an undo: a delta recorded in phase one and
 * applied only by phase-two commit (rm_at_update_delta_on_commit);
 * rollback skips it, since nothing was applied. */
/* The longest digest an undo item may carry (a SHA-256 in base64 is 44). */
#define RM_ROW_DIGEST_MAX 128
/* What the compact form keeps of a digest, and the shortest one read. */
#define RM_ROW_DIGEST_KEPT 22

typedef enum rm_op { RM_OP_INSERT = 1, RM_OP_UPDATE, RM_OP_DELETE, RM_OP_DELTA, RM_OP_COMMIT_DELTA } rm_op_t;

const char *rm_op_name(rm_op_t op);

/* One statement of a branch, as its undo needs it. */
typedef struct rm_item {
  rm_op_t op;
  char *schema;     /* resolved schema of the table */
  char *table;      /* table name (unquoted) */
  rm_row_t *pk;     /* primary key columns and values (key order) */
  rm_row_t *before; /* update, delete */
  rm_row_t *after;  /* update; insert (earlier versions: now 'digest') */
  char *digest;     /* insert: the row's digest (RM_AT_ROW_DIGEST) */
  char *col;        /* delta, commit_delta */
  long long delta;  /* delta, commit_delta */
} rm_item_t;

/* Release what 'it' owns (not 'it' itself) and zero it. */
void rm_item_clear(rm_item_t *it);
/* Whether two items name the same row (schema, table, key). */
bool rm_item_same_row(const rm_item_t *a, const rm_item_t *b);

/* The object form of one item (a new reference; what RM_UNDO_OBJECTS
 * writes), NULL on allocation failure or if a string is not valid UTF-8. */
json_t *rm_item_to_json(const rm_item_t *it);
/* The compact form of one item (a new reference; NOTES), NULL as above or
 * when the item lacks what its op needs. */
json_t *rm_item_to_compact(const rm_item_t *it);
/*
 * Parse one item, in either form, from 'j' into 'it' (zeroed first;
 * cleared again on error).  Strict: unknown op, missing or mistyped
 * fields, an empty pk, a missing image for the op, a digest shorter than
 * RM_ROW_DIGEST_KEPT are RM_E_INVALID with a reason in 'err'.
 */
int rm_item_from_json(const json_t *j, rm_item_t *it, char *err, size_t errlen);

/* Encode 'n' items as the rollback_info text (malloc'd, compact items).
 * NULL on allocation failure or invalid UTF-8. */
char *rm_undo_encode(const rm_item_t *items, size_t n);
/* Whether the digest an undo item kept ('kept', a head of at least
 * RM_ROW_DIGEST_KEPT characters, or a whole one) is the head of the row's
 * digest now ('current'). */
bool rm_digest_matches(const char *kept, const char *current);
/*
 * Decode rollback_info text into a new array of items (*out, *n); free
 * with rm_undo_free.  RM_E_INVALID (reason in 'err') if the text is not a
 * JSON array of valid items, RM_E_NOMEM.
 */
int rm_undo_decode(const char *text, rm_item_t **out, size_t *n, char *err, size_t errlen);
void rm_undo_free(rm_item_t *items, size_t n);

/*
 * Build the pk part of a lock key from the 'n' primary key values 'vals'
 * (in key order, none NULL) into 'out' (NUL-terminated).  Returns its
 * length, RM_E_INVALID when a value is NULL or n < 1, or RM_E_INVALID too
 * when it does not fit 'cap'.
 */
int rm_lockkey_pk(const char *const *vals, int n, char *out, size_t cap);
/*
 * Append the lock key of one row ("table:pk") to 'b' with
 * txp_lockkeys_append.  'resource' is used to check that the row key the
 * TC will store (resource^^^table^^^pk) fits TXP_MAX_ROW_KEY_LEN.  Returns
 * 0, RM_E_INVALID (unusable table name, key too long, 'b' full) or
 * RM_E_NOMEM.
 */
int rm_lockkeys_add(txp_buf_t *b, const char *resource, const char *table,
                    const char *const *pk_vals, int n);

/*
 * The message of a dirty write, PostgreSQL style: names the table, the key
 * and each differing column with its expected and current values (values
 * shortened past 64 bytes).  'cur' NULL means the row is gone; 'expect'
 * NULL means the row should be absent but exists.  'diff'/'ndiff' as from
 * rm_row_diff (indexes into 'expect').  Always NUL-terminates 'out'.
 */
void rm_dirty_message(char *out, size_t cap, const rm_item_t *it, const char *expect_name,
                      const rm_row_t *expect, const rm_row_t *cur, const int *diff, int ndiff);

/* ------------------------------------------------- undo context string --- */

/*
 * undo_log.context: "serializer=json;version=V[;delta=1][;commit=1][;NAME=VALUE...]"
 * where the NAME=VALUE pairs are the session settings the images were
 * taken under (TimeZone, DateStyle, ...).  Version 3 (the library writes
 * it; items in either form) leaves out a setting at its standard value
 * (RM_CTX_STANDARD_SETTINGS: a hundred bytes less in most rows) and
 * rm_ctx_parse puts it back; "commit=1" may go with it.  Values are %XX-escaped for
 * ';', '=', '%' and control bytes, so ";commit=1;" can be searched for in
 * SQL.  "commit=1" marks a row whose phase-two commit must apply its
 * commit_delta items before the row may go.  A library reads the versions
 * it knows and refuses the others ("cannot be read": an operator's)
 * rather than misread them: version 2 (commit deltas) is unknown to those
 * of before commit deltas, version 3 to those of before it, which is why
 * RM_UNDO_OBJECTS still writes 1 and 2 (rm_client.h).
 */
#define RM_CTX_MAX_SETTINGS 8
/* The settings an image's text depends on, at the values a version 3
 * context leaves out (name, value; the undo row's INSERT compares with
 * them: RM_AT_CONTEXT_SETTINGS). */
#define RM_CTX_STD_TIMEZONE "UTC"
#define RM_CTX_STD_DATESTYLE "ISO, MDY"
#define RM_CTX_STD_INTERVALSTYLE "postgres"
#define RM_CTX_STD_EXTRA_FLOAT_DIGITS "1"
#define RM_CTX_STD_BYTEA_OUTPUT "hex"
#define RM_CTX_STD_LC_MONETARY "C"
#define RM_CTX_STANDARD_SETTINGS                                                                     \
  {"TimeZone", RM_CTX_STD_TIMEZONE}, {"DateStyle", RM_CTX_STD_DATESTYLE},                           \
      {"IntervalStyle", RM_CTX_STD_INTERVALSTYLE}, {"extra_float_digits", RM_CTX_STD_EXTRA_FLOAT_DIGITS}, \
      {"bytea_output", RM_CTX_STD_BYTEA_OUTPUT}, {"lc_monetary", RM_CTX_STD_LC_MONETARY}

typedef struct rm_ctx {
  bool delta;
  bool commit; /* commit_delta items: phase-two commit applies them */
  int version;
  int nsettings;
  char *names[RM_CTX_MAX_SETTINGS];
  char *values[RM_CTX_MAX_SETTINGS];
} rm_ctx_t;

/* Format the context (malloc'd); 'names'/'values' has 'n' settings
 * (values NULL are skipped).  'commit': the undo holds commit_delta items.
 * 'compact': version 3, else as earlier versions wrote it (1, or 2 with
 * 'commit': RM_UNDO_OBJECTS).  NULL on allocation failure. */
char *rm_ctx_format(bool delta, bool commit, bool compact, int n, const char *const *names,
                    const char *const *values);
/* Parse; RM_E_INVALID for an unknown serializer or version, a malformed
 * pair, "commit=1" with version 1 or version 2 without it, or more than
 * RM_CTX_MAX_SETTINGS settings (every key other than serializer, version,
 * delta and commit is a setting; for version 3, counting the standard
 * ones put back).  Free with rm_ctx_clear. */
int rm_ctx_parse(const char *s, rm_ctx_t *ctx);
void rm_ctx_clear(rm_ctx_t *ctx);

#endif /* RM_IMAGE_H */
