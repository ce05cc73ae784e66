/*
 * rm_image.c - row images, undo items, their JSON form, lock keys and the
 * undo context: see rm_image.h.  Pure functions, safe on any thread.
 */
#include "rm_image.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_client.h"
#include "txp_lockkey.h"

#define UNDO_VERSION 1        /* images and phase-one deltas only */
#define UNDO_VERSION_COMMIT 2 /* ... and commit_delta items */
#define UNDO_VERSION_COMPACT 3 /* compact items, standard settings left out; "commit=1" as needed */

/* ------------------------------------------------------------------ rows */

rm_row_t *rm_row_new(int n) {
  if (n < 0) return NULL;
  rm_row_t *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->n = n;
  if (n > 0) {
    r->names = calloc((size_t)n, sizeof(char *));
    r->vals = calloc((size_t)n, sizeof(char *));
    if (!r->names || !r->vals) {
      free(r->names);
      free(r->vals);
      free(r);
      return NULL;
    }
  }
  return r;
}

void rm_row_free(rm_row_t *r) {
  if (!r) return;
  for (int i = 0; i < r->n; i++) {
    free(r->names[i]);
    free(r->vals[i]);
  }
  free(r->names);
  free(r->vals);
  free(r);
}

int rm_row_set(rm_row_t *r, int i, const char *name, const char *val) {
  if (!r || i < 0 || i >= r->n || !name) return RM_E_INVALID;
  char *nn = strdup(name);
  char *nv = val ? strdup(val) : NULL;
  if (!nn || (val && !nv)) {
    free(nn);
    free(nv);
    return RM_E_NOMEM;
  }
  free(r->names[i]);
  free(r->vals[i]);
  r->names[i] = nn;
  r->vals[i] = nv;
  return 0;
}

int rm_row_find(const rm_row_t *r, const char *name) {
  if (!r || !name) return -1;
  for (int i = 0; i < r->n; i++)
    if (r->names[i] && strcmp(r->names[i], name) == 0) return i;
  return -1;
}

rm_row_t *rm_row_dup(const rm_row_t *r) {
  if (!r) return NULL;
  rm_row_t *d = rm_row_new(r->n);
  if (!d) return NULL;
  for (int i = 0; i < r->n; i++) {
    if (rm_row_set(d, i, r->names[i] ? r->names[i] : "", r->vals[i]) != 0) {
      rm_row_free(d);
      return NULL;
    }
  }
  return d;
}

bool rm_val_eq(const char *a, const char *b) {
  if (!a || !b) return a == b;
  return strcmp(a, b) == 0;
}

int rm_row_diff(const rm_row_t *image, const rm_row_t *cur, int *diff, int cap) {
  int nd = 0;
  if (!image) return 0;
  for (int i = 0; i < image->n; i++) {
    int j = rm_row_find(cur, image->names[i]);
    if (j >= 0 && rm_val_eq(image->vals[i], cur->vals[j])) continue;
    if (nd < cap && diff) diff[nd] = i;
    nd++;
  }
  return nd;
}

/* ----------------------------------------------------------------- items */

static const char *const op_names[] = {NULL, "insert", "update", "delete", "delta", "commit_delta"};

const char *rm_op_name(rm_op_t op) {
  return op >= RM_OP_INSERT && op <= RM_OP_COMMIT_DELTA ? op_names[op] : "unknown";
}

static bool is_delta(rm_op_t op) { return op == RM_OP_DELTA || op == RM_OP_COMMIT_DELTA; }

void rm_item_clear(rm_item_t *it) {
  if (!it) return;
  free(it->schema);
  free(it->table);
  rm_row_free(it->pk);
  rm_row_free(it->before);
  rm_row_free(it->after);
  free(it->digest);
  free(it->col);
  memset(it, 0, sizeof(*it));
}

bool rm_item_same_row(const rm_item_t *a, const rm_item_t *b) {
  return strcmp(a->schema, b->schema) == 0 && strcmp(a->table, b->table) == 0 && a->pk->n == b->pk->n &&
         rm_row_diff(a->pk, b->pk, NULL, 0) == 0;
}

/* {name: value|null, ...}; NULL on failure (e.g. invalid UTF-8). */
static json_t *row_to_json(const rm_row_t *r) {
  json_t *o = json_object();
  if (!o) return NULL;
  for (int i = 0; i < r->n; i++) {
    json_t *v = r->vals[i] ? json_string(r->vals[i]) : json_null();
    if (!v || !r->names[i] || json_object_set_new(o, r->names[i], v) != 0) {
      if (v && !r->names[i]) json_decref(v);
      json_decref(o);
      return NULL;
    }
  }
  return o;
}

/* Add 'key': value to 'o', consuming 'v'; returns false on failure. */
static bool put(json_t *o, const char *key, json_t *v) {
  return v && json_object_set_new(o, key, v) == 0;
}

json_t *rm_item_to_json(const rm_item_t *it) {
  if (!it || it->op < RM_OP_INSERT || it->op > RM_OP_COMMIT_DELTA || !it->table || !it->pk) return NULL;
  json_t *o = json_object();
  if (!o) return NULL;
  bool ok = put(o, "op", json_string(rm_op_name(it->op))) &&
            put(o, "schema", json_string(it->schema ? it->schema : "public")) &&
            put(o, "table", json_string(it->table)) && put(o, "pk", row_to_json(it->pk));
  if (ok && it->before) ok = put(o, "before", row_to_json(it->before));
  if (ok && it->after) ok = put(o, "after", row_to_json(it->after));
  if (ok && it->digest) ok = put(o, "digest", json_string(it->digest));
  if (ok && is_delta(it->op))
    ok = it->col && put(o, "col", json_string(it->col)) &&
         put(o, "delta", json_integer((json_int_t)it->delta));
  if (!ok) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* The compact item's op codes (rm_image.h NOTES), indexed by rm_op_t. */
static const char *const op_codes[] = {NULL, "i", "u", "x", "d", "c"};

/* Elements of a compact item of 'op' before its optional schema. */
static size_t compact_len(rm_op_t op) { return op == RM_OP_UPDATE || is_delta(op) ? 5 : 4; }

/* Append 'v' to 'a', consuming it; false on failure. */
static bool push(json_t *a, json_t *v) { return v && json_array_append_new(a, v) == 0; }

json_t *rm_item_to_compact(const rm_item_t *it) {
  if (!it || it->op < RM_OP_INSERT || it->op > RM_OP_COMMIT_DELTA || !it->table || !it->pk) return NULL;
  json_t *a = json_array();
  if (!a) return NULL;
  bool ok = push(a, json_string(op_codes[it->op])) && push(a, json_string(it->table)) && push(a, row_to_json(it->pk));
  switch (it->op) {
  case RM_OP_INSERT: /* the kept head of the digest, or (earlier versions) the after image */
    if (it->digest && strlen(it->digest) < RM_ROW_DIGEST_KEPT) ok = false;
    else if (ok) ok = it->digest ? push(a, json_stringn(it->digest, RM_ROW_DIGEST_KEPT))
                                 : it->after && push(a, row_to_json(it->after));
    break;
  case RM_OP_UPDATE:
    ok = ok && it->before && it->after && push(a, row_to_json(it->before)) && push(a, row_to_json(it->after));
    break;
  case RM_OP_DELETE:
    ok = ok && it->before && push(a, row_to_json(it->before));
    break;
  default: /* RM_OP_DELTA, RM_OP_COMMIT_DELTA */
    ok = ok && it->col && push(a, json_string(it->col)) && push(a, json_integer((json_int_t)it->delta));
  }
  if (ok && it->schema && strcmp(it->schema, "public") != 0) ok = push(a, json_string(it->schema));
  if (!ok) {
    json_decref(a);
    return NULL;
  }
  return a;
}

bool rm_digest_matches(const char *kept, const char *current) {
  if (!kept || !current) return false;
  size_t n = strlen(kept);
  return n >= RM_ROW_DIGEST_KEPT && strlen(current) >= n && memcmp(kept, current, n) == 0;
}

/* Parse an image object; 'allow_empty' for pk (never) vs images. */
static rm_row_t *row_from_json(const json_t *o, bool pk, const char *what, char *err, size_t errlen) {
  if (!json_is_object(o)) {
    snprintf(err, errlen, "\"%s\" is not an object", what);
    return NULL;
  }
  size_t n = json_object_size(o);
  if (n == 0 && pk) {
    snprintf(err, errlen, "\"%s\" is empty", what);
    return NULL;
  }
  if (n > 1600) { /* PostgreSQL's column limit */
    snprintf(err, errlen, "\"%s\" has too many columns", what);
    return NULL;
  }
  rm_row_t *r = rm_row_new((int)n);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  const char *k;
  json_t *v;
  int i = 0;
  json_object_foreach((json_t *)(uintptr_t)o, k, v) {
    if (!json_is_string(v) && !(json_is_null(v) && !pk)) {
      snprintf(err, errlen, "\"%s\".\"%s\" is not a %s", what, k, pk ? "string" : "string or null");
      rm_row_free(r);
      return NULL;
    }
    if (rm_row_set(r, i++, k, json_is_string(v) ? json_string_value(v) : NULL) != 0) {
      snprintf(err, errlen, "out of memory");
      rm_row_free(r);
      return NULL;
    }
  }
  return r;
}

/* 'v' when it is a non-empty string, copied; else NULL with the reason,
 * which names it as 'name' says (a key of the object form, or a part of
 * the compact one). */
static char *dup_nonempty(const json_t *v, const char *name, char *err, size_t errlen) {
  if (!json_is_string(v) || json_string_length(v) == 0) {
    snprintf(err, errlen, "%s is missing or not a non-empty string", name);
    return NULL;
  }
  char *s = strdup(json_string_value(v));
  if (!s) snprintf(err, errlen, "out of memory");
  return s;
}

static char *dup_str_field(const json_t *o, const char *key, char *err, size_t errlen) {
  char name[64];
  snprintf(name, sizeof(name), "\"%s\"", key);
  return dup_nonempty(json_object_get(o, key), name, err, errlen);
}

/* A digest as an undo item may carry it: 0, or -1 with the reason. */
static int check_digest(const char *d, char *err, size_t errlen) {
  size_t n = strlen(d);
  if (n >= RM_ROW_DIGEST_KEPT && n <= RM_ROW_DIGEST_MAX) return 0;
  snprintf(err, errlen, "the digest is %zu bytes long, not %d to %d", n, RM_ROW_DIGEST_KEPT, RM_ROW_DIGEST_MAX);
  return -1;
}

/* The string element 'i' of 'a' (non-empty), copied; NULL with the reason. */
static char *dup_str_elem(const json_t *a, size_t i, const char *what, char *err, size_t errlen) {
  char name[64];
  snprintf(name, sizeof(name), "the %s of the undo item", what);
  return dup_nonempty(json_array_get(a, i), name, err, errlen);
}

/* The compact form: [op, table, pk, ...the op's own..., schema if not "public"]. */
static int item_from_compact(const json_t *j, rm_item_t *it, char *err, size_t errlen) {
  const char *code = json_string_value(json_array_get(j, 0));
  for (int k = RM_OP_INSERT; code && k <= RM_OP_COMMIT_DELTA; k++)
    if (strcmp(code, op_codes[k]) == 0) it->op = (rm_op_t)k;
  if (!it->op) {
    snprintf(err, errlen, "unknown undo op \"%s\"", code ? code : "(none)");
    return RM_E_INVALID;
  }
  size_t n = json_array_size(j), want = compact_len(it->op);
  if (n != want && n != want + 1) {
    snprintf(err, errlen, "a compact %s item has %zu elements, not %zu or %zu", op_names[it->op], n, want, want + 1);
    return RM_E_INVALID;
  }
  it->schema = n > want ? dup_str_elem(j, want, "schema", err, errlen) : strdup("public");
  if (!it->schema) {
    if (n == want) snprintf(err, errlen, "out of memory");
    goto fail;
  }
  if (!(it->table = dup_str_elem(j, 1, "table", err, errlen))) goto fail;
  if (!(it->pk = row_from_json(json_array_get(j, 2), true, "pk", err, errlen))) goto fail;
  const json_t *third = json_array_get(j, 3);
  switch (it->op) {
  case RM_OP_INSERT:
    if (json_is_string(third)) {
      if (!(it->digest = dup_str_elem(j, 3, "digest", err, errlen)) || check_digest(it->digest, err, errlen)) goto fail;
    } else if (!(it->after = row_from_json(third, false, "after", err, errlen))) {
      goto fail;
    }
    break;
  case RM_OP_UPDATE:
    if (!(it->before = row_from_json(third, false, "before", err, errlen))) goto fail;
    if (!(it->after = row_from_json(json_array_get(j, 4), false, "after", err, errlen))) goto fail;
    break;
  case RM_OP_DELETE:
    if (!(it->before = row_from_json(third, false, "before", err, errlen))) goto fail;
    break;
  default:
    if (!(it->col = dup_str_elem(j, 3, "column", err, errlen))) goto fail;
    if (!json_is_integer(json_array_get(j, 4))) {
      snprintf(err, errlen, "the delta of the undo item is missing or not an integer");
      goto fail;
    }
    it->delta = (long long)json_integer_value(json_array_get(j, 4));
  }
  return 0;
fail:
  rm_item_clear(it);
  return RM_E_INVALID;
}

int rm_item_from_json(const json_t *j, rm_item_t *it, char *err, size_t errlen) {
  memset(it, 0, sizeof(*it));
  if (json_is_array(j)) return item_from_compact(j, it, err, errlen);
  if (!json_is_object(j)) {
    snprintf(err, errlen, "undo item is neither an object nor an array");
    return RM_E_INVALID;
  }
  const char *op = json_string_value(json_object_get(j, "op"));
  for (int k = RM_OP_INSERT; op && k <= RM_OP_COMMIT_DELTA; k++)
    if (strcmp(op, op_names[k]) == 0) it->op = (rm_op_t)k;
  if (!it->op) {
    snprintf(err, errlen, "unknown undo op \"%s\"", op ? op : "(none)");
    return RM_E_INVALID;
  }
  if (!(it->schema = dup_str_field(j, "schema", err, errlen))) goto fail;
  if (!(it->table = dup_str_field(j, "table", err, errlen))) goto fail;
  if (!(it->pk = row_from_json(json_object_get(j, "pk"), true, "pk", err, errlen))) goto fail;
  bool want_before = it->op == RM_OP_UPDATE || it->op == RM_OP_DELETE;
  const json_t *b = json_object_get(j, "before"), *a = json_object_get(j, "after");
  /* An insert has its digest or (earlier versions) its after image. */
  bool want_digest = it->op == RM_OP_INSERT && !a;
  bool want_after = it->op == RM_OP_UPDATE || (it->op == RM_OP_INSERT && !want_digest);
  if (want_before && !(it->before = row_from_json(b, false, "before", err, errlen))) goto fail;
  if (want_after && !(it->after = row_from_json(a, false, "after", err, errlen))) goto fail;
  if (want_digest) {
    if (!(it->digest = dup_str_field(j, "digest", err, errlen)) || check_digest(it->digest, err, errlen)) goto fail;
  }
  if (is_delta(it->op)) {
    if (!(it->col = dup_str_field(j, "col", err, errlen))) goto fail;
    const json_t *d = json_object_get(j, "delta");
    if (!json_is_integer(d)) {
      snprintf(err, errlen, "\"delta\" is missing or not an integer");
      goto fail;
    }
    it->delta = (long long)json_integer_value(d);
  }
  return 0;
fail:
  rm_item_clear(it);
  return RM_E_INVALID;
}

char *rm_undo_encode(const rm_item_t *items, size_t n) {
  json_t *arr = json_array();
  if (!arr) return NULL;
  for (size_t i = 0; i < n; i++) {
    json_t *o = rm_item_to_compact(&items[i]);
    if (!o || json_array_append_new(arr, o) != 0) {
      json_decref(arr);
      return NULL;
    }
  }
  char *s = json_dumps(arr, JSON_COMPACT);
  json_decref(arr);
  return s;
}



void rm_undo_free(rm_item_t *items, size_t n) {
  if (!items) return;
  for (size_t i = 0; i < n; i++) rm_item_clear(&items[i]);
  free(items);
}

int rm_undo_decode(const char *text, rm_item_t **out, size_t *n, char *err, size_t errlen) {
  *out = NULL;
  *n = 0;
  if (!text) {
    snprintf(err, errlen, "rollback_info is null");
    return RM_E_INVALID;
  }
  json_error_t je;
  json_t *arr = json_loads(text, JSON_REJECT_DUPLICATES, &je);
  if (!arr) {
    snprintf(err, errlen, "rollback_info is not JSON: %s", je.text);
    return RM_E_INVALID;
  }
  if (!json_is_array(arr) || json_array_size(arr) == 0) {
    snprintf(err, errlen, "rollback_info is not a non-empty array");
    json_decref(arr);
    return RM_E_INVALID;
  }
  size_t cnt = json_array_size(arr);
  rm_item_t *items = calloc(cnt, sizeof(*items));
  if (!items) {
    json_decref(arr);
    snprintf(err, errlen, "out of memory");
    return RM_E_NOMEM;
  }
  for (size_t i = 0; i < cnt; i++) {
    char why[200];
    if (rm_item_from_json(json_array_get(arr, i), &items[i], why, sizeof(why)) != 0) {
      snprintf(err, errlen, "undo item %zu: %s", i, why);
      rm_undo_free(items, i);
      json_decref(arr);
      return RM_E_INVALID;
    }
  }
  json_decref(arr);
  *out = items;
  *n = cnt;
  return 0;
}

/* ------------------------------------------------------------- lock keys */

static bool needs_hex(const char *v, bool composite) {
  size_t n = strlen(v);
  if (n == 0 || !txp_lockkey_part_ok(v, n)) return true;
  if (v[0] == '\\' && v[1] == 'x') return true;
  return composite && strchr(v, '_') != NULL;
}

int rm_lockkey_pk(const char *const *vals, int n, char *out, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  if (!vals || n < 1 || !out || cap == 0) return RM_E_INVALID;
  size_t w = 0;
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    const char *v = vals[i];
    if (!v) return RM_E_INVALID;
    size_t len = strlen(v);
    bool hx = needs_hex(v, n > 1);
    size_t need = (i > 0) + (hx ? 2 + 2 * len : len);
    if (need >= cap - w) return RM_E_INVALID;
    if (i > 0) out[w++] = '_';
    if (hx) {
      out[w++] = '\\';
      out[w++] = 'x';
      for (size_t k = 0; k < len; k++) {
        out[w++] = hex[(unsigned char)v[k] >> 4];
        out[w++] = hex[(unsigned char)v[k] & 15];
      }
    } else {
      memcpy(out + w, v, len);
      w += len;
    }
    out[w] = '\0';
  }
  return (int)w;
}

int rm_lockkeys_add(txp_buf_t *b, const char *resource, const char *table,
                    const char *const *pk_vals, int n) {
  char pk[TXP_MAX_ROW_KEY_LEN + 1];
  if (!b || !resource || !table) return RM_E_INVALID;
  int len = rm_lockkey_pk(pk_vals, n, pk, sizeof(pk));
  if (len < 0) return RM_E_INVALID;
  size_t row_key = strlen(resource) + 2 * (sizeof(TXP_ROW_KEY_SEP) - 1) + strlen(table) + (size_t)len;
  if (row_key > TXP_MAX_ROW_KEY_LEN) return RM_E_INVALID;
  size_t old = b->len;
  int rc = txp_lockkeys_append(b, table, pk);
  /* txp_lockkeys_append restores the length on failure but not the NUL
   * after it (its partial appends moved it): put it back. */
  if (rc != 0 && b->data && b->alloc > old) b->data[old] = '\0';
  if (rc == TXP_ENOMEM) return RM_E_NOMEM;
  return rc == 0 ? 0 : RM_E_INVALID;
}

/* ------------------------------------------------------- dirty messages */

/* Append to out[*w..cap) with snprintf semantics, never past the end. */
static void app(char *out, size_t cap, size_t *w, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void app(char *out, size_t cap, size_t *w, const char *fmt, ...) {
  if (*w >= cap - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(out + *w, cap - *w, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  *w += (size_t)k;
  if (*w > cap - 1) *w = cap - 1;
}

/* A value for a message: quoted, shortened, "NULL" for SQL NULL. */
static void app_val(char *out, size_t cap, size_t *w, const char *v) {
  if (!v) {
    app(out, cap, w, "NULL");
    return;
  }
  size_t len = strlen(v);
  if (len > 64) app(out, cap, w, "\"%.64s...\"", v);
  else app(out, cap, w, "\"%s\"", v);
}

void rm_dirty_message(char *out, size_t cap, const rm_item_t *it, const char *expect_name,
                      const rm_row_t *expect, const rm_row_t *cur, const int *diff, int ndiff) {
  size_t w = 0;
  if (!out || cap == 0) return;
  out[0] = '\0';
  app(out, cap, &w, "dirty write on \"%s\".\"%s\" key (", it->schema ? it->schema : "?",
      it->table ? it->table : "?");
  for (int i = 0; it->pk && i < it->pk->n; i++) app(out, cap, &w, "%s%s", i ? ", " : "", it->pk->names[i]);
  app(out, cap, &w, ")=(");
  for (int i = 0; it->pk && i < it->pk->n; i++) {
    if (i) app(out, cap, &w, ", ");
    app_val(out, cap, &w, it->pk->vals[i]);
  }
  app(out, cap, &w, ")");
  if (!cur) {
    app(out, cap, &w, ": the row was deleted since the branch (undo of %s)", rm_op_name(it->op));
  } else if (!expect && it->digest) {
    app(out, cap, &w, ": the row changed since the branch inserted it (its digest differs); now");
    for (int i = 0; i < cur->n; i++) {
      app(out, cap, &w, "%s %s ", i ? "," : "", cur->names[i]);
      app_val(out, cap, &w, cur->vals[i]);
    }
  } else if (!expect) {
    app(out, cap, &w, ": a row exists that the branch did not leave (undo of %s)", rm_op_name(it->op));
  } else {
    app(out, cap, &w, ": %d column%s changed since the branch (undo of %s):", ndiff,
        ndiff == 1 ? "" : "s", rm_op_name(it->op));
    for (int i = 0; i < ndiff; i++) {
      int k = diff[i];
      if (k < 0 || k >= expect->n) continue;
      int j = rm_row_find(cur, expect->names[k]);
      app(out, cap, &w, "%s %s %s ", i ? ";" : "", expect->names[k], expect_name);
      app_val(out, cap, &w, expect->vals[k]);
      app(out, cap, &w, ", now ");
      if (j < 0) app(out, cap, &w, "(no such column)");
      else app_val(out, cap, &w, cur->vals[j]);
    }
  }
  app(out, cap, &w, "; nothing was overwritten: repair the row, then re-drive the rollback");
}

/* ------------------------------------------------------------- context */

static bool ctx_escape_char(unsigned char c) { return c == ';' || c == '=' || c == '%' || c < 0x20 || c == 0x7f; }

static int ctx_append_escaped(txp_buf_t *b, const char *s) {
  static const char hex[] = "0123456789ABCDEF";
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    int rc;
    if (ctx_escape_char(*p)) {
      char e[3] = {'%', hex[*p >> 4], hex[*p & 15]};
      rc = txp_buf_append(b, e, 3);
    } else {
      rc = txp_buf_append(b, p, 1);
    }
    if (rc) return rc;
  }
  return 0;
}

char *rm_ctx_format(bool delta, bool commit, bool compact, int n, const char *const *names,
                    const char *const *values) {
  txp_buf_t b;
  txp_buf_init(&b, 0);
  int rc = txp_buf_append_str(&b, compact  ? "serializer=json;version=3"
                                  : commit ? "serializer=json;version=2"
                                           : "serializer=json;version=1");
  if (!rc && delta) rc = txp_buf_append_str(&b, ";delta=1");
  if (!rc && commit) rc = txp_buf_append_str(&b, ";commit=1");
  for (int i = 0; !rc && i < n; i++) {
    if (!names[i] || !values[i]) continue;
    rc = txp_buf_append_str(&b, ";");
    if (!rc) rc = ctx_append_escaped(&b, names[i]);
    if (!rc) rc = txp_buf_append_str(&b, "=");
    if (!rc) rc = ctx_append_escaped(&b, values[i]);
  }
  if (rc) {
    txp_buf_free(&b);
    return NULL;
  }
  return b.data; /* NUL-terminated by txp_buf_append */
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Unescape s[0..n) into a new string; NULL if malformed (a '%' not
 * followed by two hex digits, or an escaped NUL) or out of memory. */
static char *ctx_unescape(const char *s, size_t n) {
  char *o = malloc(n + 1);
  if (!o) return NULL;
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '%') {
      o[w++] = s[i];
      continue;
    }
    int hi = i + 2 < n ? hexval(s[i + 1]) : -1;
    int lo = i + 2 < n ? hexval(s[i + 2]) : -1;
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
      free(o);
      return NULL;
    }
    o[w++] = (char)(hi * 16 + lo);
    i += 2;
  }
  o[w] = '\0';
  return o;
}

void rm_ctx_clear(rm_ctx_t *ctx) {
  if (!ctx) return;
  for (int i = 0; i < ctx->nsettings; i++) {
    free(ctx->names[i]);
    free(ctx->values[i]);
  }
  memset(ctx, 0, sizeof(*ctx));
}

/* Version 3 leaves out a setting at its standard value (rm_image.h):
 * put those back, so that the rollback sets every one as before. */
static int add_standard_settings(rm_ctx_t *ctx) {
  static const char *const std[][2] = {RM_CTX_STANDARD_SETTINGS};
  for (size_t i = 0; i < sizeof(std) / sizeof(std[0]); i++) {
    bool have = false;
    for (int k = 0; k < ctx->nsettings && !have; k++) have = strcmp(ctx->names[k], std[i][0]) == 0;
    if (have) continue;
    if (ctx->nsettings == RM_CTX_MAX_SETTINGS) return -1;
    ctx->names[ctx->nsettings] = strdup(std[i][0]);
    ctx->values[ctx->nsettings] = strdup(std[i][1]);
    ctx->nsettings++;
    if (!ctx->names[ctx->nsettings - 1] || !ctx->values[ctx->nsettings - 1]) return -1;
  }
  return 0;
}

int rm_ctx_parse(const char *s, rm_ctx_t *ctx) {
  memset(ctx, 0, sizeof(*ctx));
  if (!s) return RM_E_INVALID;
  bool json = false;
  const char *p = s;
  while (*p) {
    const char *end = strchr(p, ';');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    if (!eq || eq == p) goto bad;
    size_t kl = (size_t)(eq - p), vl = len - kl - 1;
    char *k = ctx_unescape(p, kl), *v = ctx_unescape(eq + 1, vl);
    if (!k || !v) {
      free(k);
      free(v);
      goto bad;
    }
    bool keep = false;
    if (strcmp(k, "serializer") == 0) {
      json = strcmp(v, "json") == 0;
    } else if (strcmp(k, "version") == 0) {
      ctx->version = atoi(v);
    } else if (strcmp(k, "delta") == 0) {
      ctx->delta = strcmp(v, "1") == 0;
    } else if (strcmp(k, "commit") == 0) {
      ctx->commit = strcmp(v, "1") == 0;
    } else if (ctx->nsettings < RM_CTX_MAX_SETTINGS) {
      ctx->names[ctx->nsettings] = k;
      ctx->values[ctx->nsettings] = v;
      ctx->nsettings++;
      keep = true;
    } else {
      free(k);
      free(v);
      goto bad;
    }
    if (!keep) {
      free(k);
      free(v);
    }
    if (!end) break;
    p = end + 1;
  }
  if (!json || ctx->version < UNDO_VERSION || ctx->version > UNDO_VERSION_COMPACT) goto bad;
  /* Version 2 is exactly "commit=1"; version 3 says it when it is so. */
  if (ctx->version < UNDO_VERSION_COMPACT && ctx->commit != (ctx->version == UNDO_VERSION_COMMIT)) goto bad;
  if (ctx->version == UNDO_VERSION_COMPACT && add_standard_settings(ctx) != 0) goto bad;
  return 0;
bad:
  rm_ctx_clear(ctx);
  return RM_E_INVALID;
}
