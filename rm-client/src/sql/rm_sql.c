/*
 * rm_sql.c - plain SQL parsed and classified, and its before-image query
 * (rm_sql.h).  libpg_query gives the statement as a protobuf tree; the
 * image query is a new SelectStmt over the statement's own RangeVar and
 * WHERE node, deparsed by the same library, so no clause is ever cut out
 * of text by position.
 */
#include "rm_sql.h"

#include <pg_query.h>
#include <pg_query/pg_query.pb-c.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_client.h"
#include "txc_fnv.h"

/* protobuf-c's __INIT macros cast away the const of its empty string; gcc
 * forgives that in a system header's macro, clang does not. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wcast-qual"
#endif

static const char *const kind_names[] = {NULL, "insert", "update", "delete", "select for update", "read"};

const char *rm_sql_kind_name(rm_sql_kind_t kind) {
  return kind >= RM_SQL_INSERT && kind <= RM_SQL_READ ? kind_names[kind] : "unknown";
}

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}

void rm_sql_stmt_clear(rm_sql_stmt_t *s) {
  if (!s) return;
  free(s->schema);
  free(s->table);
  free(s->image_sql);
  free(s->image_params);
  free(s->alias);
  free(s->base_sql);
  free(s->returning_sql);
  for (int i = 0; i < s->nset; i++) free(s->set_cols[i]);
  free(s->set_cols);
  free(s->delta_col);
  free(s->delta_value);
  for (int i = 0; i < s->neq; i++) {
    free(s->eqs[i].col);
    free(s->eqs[i].value);
  }
  free(s->eqs);
  memset(s, 0, sizeof(*s));
}

/* "" (protobuf's empty string) and NULL both mean absent. */
static const char *str_or_null(const char *s) { return s && s[0] ? s : NULL; }

/* ------------------------------------------------------------ parameters */

/*
 * The $n of 'sql' through the scanner (not the tree: a parameter may sit
 * anywhere).  With 'used' NULL: the highest n in *max.  Else sets used[n-1]
 * for each n (n <= nused).  Returns 0 or RM_E_INVALID / RM_E_NOMEM.
 */
static int scan_params(const char *sql, int *max, bool *used, int nused, char *err, size_t errlen) {
  PgQueryScanResult r = pg_query_scan(sql);
  int rc = 0;
  if (r.error) {
    rc = fail(err, errlen, RM_E_INVALID, "syntax error: %s", r.error->message);
    goto out;
  }
  PgQuery__ScanResult *sr = pg_query__scan_result__unpack(NULL, r.pbuf.len, (const uint8_t *)r.pbuf.data);
  if (!sr) {
    rc = fail(err, errlen, RM_E_NOMEM, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < sr->n_tokens && rc == 0; i++) {
    const PgQuery__ScanToken *t = sr->tokens[i];
    if (t->token != PG_QUERY__TOKEN__PARAM) continue;
    long n = strtol(sql + t->start + 1, NULL, 10); /* "$n": the scanner took the digits */
    if (n < 1 || n > RM_SQL_MAX_PARAMS) {
      rc = fail(err, errlen, RM_E_NOT_SUPPORTED, "parameter $%ld: parameters are $1 to $%d", n, RM_SQL_MAX_PARAMS);
      break;
    }
    if (max && n > *max) *max = (int)n;
    if (used && n <= nused) used[n - 1] = true;
  }
  pg_query__scan_result__free_unpacked(sr, NULL);
out:
  pg_query_free_scan_result(r);
  return rc;
}

/* ------------------------------------------------------------ the image */

/* The statement 'stmt' as SQL text (malloc'd in *out), through the
 * library's deparser. */
static int deparse_one(const PgQuery__ParseResult *parsed, PgQuery__Node *stmt, char **out, char *err, size_t errlen) {
  PgQuery__RawStmt raw = PG_QUERY__RAW_STMT__INIT;
  raw.stmt = stmt;
  PgQuery__RawStmt *raws[1] = {&raw};
  PgQuery__ParseResult pr = PG_QUERY__PARSE_RESULT__INIT;
  pr.version = parsed->version;
  pr.n_stmts = 1;
  pr.stmts = raws;
  size_t len = pg_query__parse_result__get_packed_size(&pr);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return fail(err, errlen, RM_E_NOMEM, "out of memory");
  pg_query__parse_result__pack(&pr, buf);
  PgQueryProtobuf pb = {.len = len, .data = (char *)buf};
  PgQueryDeparseResult d = pg_query_deparse_protobuf(pb);
  free(buf);
  int rc = 0;
  if (d.error) rc = fail(err, errlen, RM_E_NOT_SUPPORTED, "could not rebuild the statement: %s", d.error->message);
  else if (!(*out = strdup(d.query))) rc = fail(err, errlen, RM_E_NOMEM, "out of memory");
  pg_query_free_deparse_result(d);
  return rc;
}

/*
 * The RETURNING list 'targets' as text ("a, b AS x, *"): deparsed as the
 * target list of a SELECT, whose keyword is then cut.
 */
static int returning_text(const PgQuery__ParseResult *parsed, PgQuery__Node **targets, size_t n, char **out,
                          char *err, size_t errlen) {
  PgQuery__SelectStmt sel = PG_QUERY__SELECT_STMT__INIT;
  sel.n_target_list = n;
  sel.target_list = targets;
  sel.limit_option = PG_QUERY__LIMIT_OPTION__LIMIT_OPTION_DEFAULT;
  sel.op = PG_QUERY__SET_OPERATION__SETOP_NONE;
  PgQuery__Node node = PG_QUERY__NODE__INIT;
  node.node_case = PG_QUERY__NODE__NODE_SELECT_STMT;
  node.select_stmt = &sel;
  char *text = NULL;
  int rc = deparse_one(parsed, &node, &text, err, errlen);
  if (rc) return rc;
  static const char kw[] = "SELECT ";
  if (strncmp(text, kw, sizeof(kw) - 1) != 0) {
    free(text);
    return fail(err, errlen, RM_E_NOT_SUPPORTED, "could not rebuild the RETURNING list");
  }
  memmove(text, text + sizeof(kw) - 1, strlen(text) - (sizeof(kw) - 1) + 1);
  *out = text;
  return 0;
}

/* 'json' (a parse tree as libpg_query prints it) without the positions
 * in the text: two trees that differ only there compare equal.  The
 * result is only compared, never parsed. */
static void strip_positions(char *json) {
  static const char *const keys[] = {"\"location\":", "\"stmt_location\":", "\"stmt_len\":"};
  char *w = json;
  for (const char *r = json; *r;) {
    bool cut = false;
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]) && !cut; k++) {
      size_t n = strlen(keys[k]);
      if (strncmp(r, keys[k], n) == 0) {
        r += n;
        if (*r == '-') r++;
        while (*r >= '0' && *r <= '9') r++;
        cut = true;
      }
    }
    if (!cut) *w++ = *r++;
  }
  *w = '\0';
}

/* Whether 'a' and 'b' parse to the same tree (positions aside). */
static int same_tree(const char *a, const char *b, bool *same, char *err, size_t errlen) {
  PgQueryParseResult ra = pg_query_parse(a), rb = pg_query_parse(b);
  int rc = 0;
  if (ra.error || rb.error || !ra.parse_tree || !rb.parse_tree) {
    rc = fail(err, errlen, RM_E_NOT_SUPPORTED, "the statement rebuilt does not parse: %s",
              ra.error ? ra.error->message : rb.error ? rb.error->message : "no tree");
  } else {
    strip_positions(ra.parse_tree);
    strip_positions(rb.parse_tree);
    *same = strcmp(ra.parse_tree, rb.parse_tree) == 0;
  }
  pg_query_free_parse_result(ra);
  pg_query_free_parse_result(rb);
  return rc;
}

/*
 * The statement 'stmt' again without its RETURNING list (which the AT
 * layer writes: its images, then the caller's list), in s->base_sql, and
 * that list as text in s->returning_sql.  The tree is changed only for the
 * deparse and restored.  The deparser is checked, not trusted: the two
 * put together must parse to the tree of 'sql' itself, or the statement
 * is refused (a construct the deparser would change; its WHERE is then
 * known faithful for the before image too, the same node printed by the
 * same code).
 */
static int base_and_returning(const char *sql, const PgQuery__ParseResult *parsed, PgQuery__Node *stmt,
                              PgQuery__RangeVar *rel, size_t *n_returning, PgQuery__Node ***returning,
                              rm_sql_stmt_t *s, char *err, size_t errlen) {
  int rc = 0;
  if (*n_returning > 0) rc = returning_text(parsed, *returning, *n_returning, &s->returning_sql, err, errlen);
  if (rc) return rc;
  if (rel->alias && str_or_null(rel->alias->aliasname) && !(s->alias = strdup(rel->alias->aliasname)))
    return fail(err, errlen, RM_E_NOMEM, "out of memory");
  size_t was_n = *n_returning;
  PgQuery__Node **was_list = *returning;
  *n_returning = 0;
  *returning = NULL;
  rc = deparse_one(parsed, stmt, &s->base_sql, err, errlen);
  *n_returning = was_n;
  *returning = was_list;
  if (rc) return rc;
  size_t len = strlen(s->base_sql) + (s->returning_sql ? strlen(s->returning_sql) + 16 : 0) + 1;
  char *whole = malloc(len);
  if (!whole) return fail(err, errlen, RM_E_NOMEM, "out of memory");
  snprintf(whole, len, "%s%s%s", s->base_sql, s->returning_sql ? " RETURNING " : "",
           s->returning_sql ? s->returning_sql : "");
  bool same = false;
  rc = same_tree(sql, whole, &same, err, errlen);
  free(whole);
  if (rc == 0 && !same)
    rc = fail(err, errlen, RM_E_NOT_SUPPORTED,
              "the statement cannot be rebuilt faithfully (a construct the parser library prints "
              "differently, such as SET (a, b) = (...)): write it another way, e.g. SET a = ..., b = ...");
  return rc;
}

/*
 * SELECT * FROM <rel> WHERE <where> FOR UPDATE, deparsed (malloc'd): the
 * tree of that statement as the parser gives it for a stand-in table,
 * with the statement's own relation, condition (and, for a SELECT, its
 * ORDER BY and LIMIT: it locks only the rows it returns) put in for the
 * deparse, then taken out again before the tree is freed.
 */
static int image_query(const PgQuery__ParseResult *parsed, PgQuery__RangeVar *rel, PgQuery__Node *where,
                       const PgQuery__SelectStmt *order_limit, char **out, char *err, size_t errlen) {
  PgQueryProtobufParseResult r = pg_query_parse_protobuf("SELECT * FROM t FOR UPDATE");
  PgQuery__ParseResult *tpl =
    r.error ? NULL : pg_query__parse_result__unpack(NULL, r.parse_tree.len, (const uint8_t *)r.parse_tree.data);
  pg_query_free_protobuf_parse_result(r);
  if (!tpl) return fail(err, errlen, RM_E_NOMEM, "out of memory");
  PgQuery__SelectStmt *sel = tpl->stmts[0]->stmt->select_stmt;
  PgQuery__RangeVar *was_rel = sel->from_clause[0]->range_var;
  PgQuery__SelectStmt keep = *sel;
  sel->from_clause[0]->range_var = rel;
  sel->where_clause = where;
  if (order_limit) {
    sel->n_sort_clause = order_limit->n_sort_clause;
    sel->sort_clause = order_limit->sort_clause;
    sel->limit_count = order_limit->limit_count;
    sel->limit_offset = order_limit->limit_offset;
    sel->limit_option = order_limit->limit_option;
  }
  int rc = deparse_one(parsed, tpl->stmts[0]->stmt, out, err, errlen);
  *sel = keep; /* the borrowed nodes belong to the statement's tree */
  sel->from_clause[0]->range_var = was_rel;
  pg_query__parse_result__free_unpacked(tpl, NULL);
  return rc;
}

/* ------------------------------------------------------- classification */

static int take_relation(rm_sql_stmt_t *s, const PgQuery__RangeVar *rel, char *err, size_t errlen) {
  if (!rel || !str_or_null(rel->relname)) return fail(err, errlen, RM_E_NOT_SUPPORTED, "the statement names no table");
  if (str_or_null(rel->catalogname))
    return fail(err, errlen, RM_E_NOT_SUPPORTED, "table \"%s\" is qualified by a database name", rel->relname);
  const char *schema = str_or_null(rel->schemaname);
  if ((schema && !(s->schema = strdup(schema))) || !(s->table = strdup(rel->relname)))
    return fail(err, errlen, RM_E_NOMEM, "out of memory");
  s->only = !rel->inh;
  return 0;
}

/* Whether 'n' is WHERE CURRENT OF (alone: it cannot be combined). */
static bool current_of(const PgQuery__Node *n) { return n && n->node_case == PG_QUERY__NODE__NODE_CURRENT_OF_EXPR; }

static int classify_insert(const char *sql, PgQuery__Node *n, const PgQuery__ParseResult *parsed, rm_sql_stmt_t *s,
                           char *err, size_t errlen) {
  PgQuery__InsertStmt *st = n->insert_stmt;
  int rc = take_relation(s, st->relation, err, errlen);
  if (rc) return rc;
  if (st->with_clause) return fail(err, errlen, RM_E_NOT_SUPPORTED, "INSERT with a WITH clause: a CTE may write");
  if (st->on_conflict_clause)
    return fail(err, errlen, RM_E_NOT_SUPPORTED,
                "INSERT ... ON CONFLICT into \"%s\": whether it inserts or updates is only known at run time",
                s->table);
  const PgQuery__Node *src = st->select_stmt;
  if (!src) {
    s->nrows = 1; /* DEFAULT VALUES */
  } else {
    const PgQuery__SelectStmt *v = src->node_case == PG_QUERY__NODE__NODE_SELECT_STMT ? src->select_stmt : NULL;
    if (!v || v->n_values_lists == 0 || v->n_from_clause || v->n_target_list ||
        v->op != PG_QUERY__SET_OPERATION__SETOP_NONE || v->with_clause || v->n_sort_clause || v->limit_count ||
        v->limit_offset)
      return fail(err, errlen, RM_E_NOT_SUPPORTED,
                  "INSERT into \"%s\" from a query: only INSERT ... VALUES is supported (the rows are known "
                  "before it runs)",
                  s->table);
    s->nrows = (int)v->n_values_lists;
  }
  s->kind = RM_SQL_INSERT;
  s->returning = st->n_returning_list > 0;
  return base_and_returning(sql, parsed, n, st->relation, &st->n_returning_list, &st->returning_list, s, err,
                            errlen);
}

/* The columns an UPDATE sets, by name (SET a = .., (b, c) = (..)). */
static int take_set_cols(const PgQuery__UpdateStmt *u, rm_sql_stmt_t *s, char *err, size_t errlen) {
  if (u->n_target_list == 0) return 0;
  if (!(s->set_cols = calloc(u->n_target_list, sizeof(char *)))) return fail(err, errlen, RM_E_NOMEM, "out of memory");
  for (size_t i = 0; i < u->n_target_list; i++) {
    const PgQuery__Node *t = u->target_list[i];
    const char *name = t->node_case == PG_QUERY__NODE__NODE_RES_TARGET ? str_or_null(t->res_target->name) : NULL;
    if (!name) return fail(err, errlen, RM_E_NOT_SUPPORTED, "UPDATE ... SET without a column name");
    if (t->res_target->n_indirection)
      return fail(err, errlen, RM_E_NOT_SUPPORTED,
                  "UPDATE ... SET %s[...] or %s.field: set the whole column (its image is the whole value)", name,
                  name);
    if (!(s->set_cols[s->nset] = strdup(name))) return fail(err, errlen, RM_E_NOMEM, "out of memory");
    s->nset++;
  }
  return 0;
}

/* ------------------------------------------- deltas and key conditions */

/* The column a ColumnRef names (its last field; a qualifier is the
 * statement's own table or alias, the only one in scope), or NULL. */
static const char *column_of(const PgQuery__Node *n) {
  if (!n || n->node_case != PG_QUERY__NODE__NODE_COLUMN_REF || n->column_ref->n_fields == 0) return NULL;
  const PgQuery__Node *last = n->column_ref->fields[n->column_ref->n_fields - 1];
  return last->node_case == PG_QUERY__NODE__NODE_STRING ? str_or_null(last->string->sval) : NULL;
}

/* The operator of a binary A_Expr ("+", "="), or NULL. */
static const char *op_of(const PgQuery__Node *n) {
  if (!n || n->node_case != PG_QUERY__NODE__NODE_A_EXPR) return NULL;
  const PgQuery__AExpr *e = n->a_expr;
  if (e->kind != PG_QUERY__A__EXPR__KIND__AEXPR_OP || e->n_name != 1 || !e->lexpr || !e->rexpr ||
      e->name[0]->node_case != PG_QUERY__NODE__NODE_STRING)
    return NULL;
  return e->name[0]->string->sval;
}

/* A parameter ($n, maybe cast) in *param, or a literal in *value
 * (malloc'd: a number or a string); false for anything else. */
static bool operand_of(const PgQuery__Node *n, bool numbers_only, int *param, char **value) {
  *param = 0;
  *value = NULL;
  if (n && n->node_case == PG_QUERY__NODE__NODE_TYPE_CAST) n = n->type_cast->arg;
  if (!n) return false;
  if (n->node_case == PG_QUERY__NODE__NODE_PARAM_REF) {
    *param = n->param_ref->number;
    return *param > 0;
  }
  if (n->node_case != PG_QUERY__NODE__NODE_A_CONST || n->a_const->isnull) return false;
  const PgQuery__AConst *c = n->a_const;
  char num[32];
  const char *text = NULL;
  if (c->val_case == PG_QUERY__A__CONST__VAL_IVAL) {
    snprintf(num, sizeof(num), "%d", c->ival->ival);
    text = num;
  } else if (c->val_case == PG_QUERY__A__CONST__VAL_FVAL) {
    text = c->fval->fval;
  } else if (c->val_case == PG_QUERY__A__CONST__VAL_SVAL && !numbers_only) {
    text = c->sval->sval;
  }
  return text && (*value = strdup(text)) != NULL;
}

/* SET c = c + X / c - X: the delta's column, sign and amount. */
static int take_delta(const PgQuery__UpdateStmt *u, rm_sql_stmt_t *s, char *err, size_t errlen) {
  if (u->n_target_list != 1 || u->target_list[0]->node_case != PG_QUERY__NODE__NODE_RES_TARGET) return 0;
  const PgQuery__ResTarget *t = u->target_list[0]->res_target;
  const char *op = op_of(t->val);
  if (!op || (strcmp(op, "+") != 0 && strcmp(op, "-") != 0)) return 0;
  const char *col = column_of(t->val->a_expr->lexpr);
  if (!col || !t->name || strcmp(col, t->name) != 0) return 0;
  int param = 0;
  char *value = NULL;
  if (!operand_of(t->val->a_expr->rexpr, true, &param, &value)) return 0;
  if (!(s->delta_col = strdup(col))) {
    free(value);
    return fail(err, errlen, RM_E_NOMEM, "out of memory");
  }
  s->delta_sign = op[0] == '+' ? 1 : -1;
  s->delta_param = param;
  s->delta_value = value;
  return 0;
}

/* The conjuncts of 'where' of the form col = X, and whether there are
 * others. */
static int take_eqs(const PgQuery__Node *where, rm_sql_stmt_t *s, char *err, size_t errlen) {
  const PgQuery__Node *const *args = &where;
  size_t n = 1;
  if (where->node_case == PG_QUERY__NODE__NODE_BOOL_EXPR &&
      where->bool_expr->boolop == PG_QUERY__BOOL_EXPR_TYPE__AND_EXPR) {
    args = (const PgQuery__Node *const *)where->bool_expr->args;
    n = where->bool_expr->n_args;
  }
  if (!(s->eqs = calloc(n, sizeof(*s->eqs)))) return fail(err, errlen, RM_E_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    const char *op = op_of(args[i]);
    const char *col = op && strcmp(op, "=") == 0 ? column_of(args[i]->a_expr->lexpr) : NULL;
    rm_sql_eq_t *e = &s->eqs[s->neq];
    if (!col || !operand_of(args[i]->a_expr->rexpr, false, &e->param, &e->value)) {
      s->where_more = true;
      continue;
    }
    if (!(e->col = strdup(col))) return fail(err, errlen, RM_E_NOMEM, "out of memory");
    s->neq++;
  }
  return 0;
}

/* ------------------------------------------------ volatile conditions */

/* Functions whose every call may give another result or act again: a
 * condition runs twice (the before image, then the statement). */
static const char *const volatile_funcs[] = {
  "random", "random_normal", "nextval", "setval", "clock_timestamp", "statement_timestamp", "timeofday",
  "gen_random_uuid", "uuid_generate_v1", "uuid_generate_v1mc", "uuid_generate_v4", "pg_sleep", "pg_sleep_for",
  "pg_sleep_until", "set_config", "pg_advisory_lock", "pg_advisory_xact_lock", "pg_try_advisory_lock",
  "pg_try_advisory_xact_lock", "pg_notify", "dblink", "dblink_exec", "lo_import", "lo_export", "lo_unlink",
};

#define WALK_MAX_DEPTH 2000

typedef struct volatile_hit {
  const char *name; /* the first volatile function met */
  bool too_deep;
} volatile_hit_t;

/* Every message of the tree under 'm' (protobuf-c's own field tables:
 * every node kind, present and future), looking for calls of the
 * functions above. */
static void find_volatile(const ProtobufCMessage *m, volatile_hit_t *hit, int depth) {
  if (!m || hit->name || hit->too_deep) return;
  if (depth > WALK_MAX_DEPTH) {
    hit->too_deep = true;
    return;
  }
  if (m->descriptor == &pg_query__func_call__descriptor) {
    const PgQuery__FuncCall *f = (const PgQuery__FuncCall *)m;
    const PgQuery__Node *last = f->n_funcname ? f->funcname[f->n_funcname - 1] : NULL;
    const char *name = last && last->node_case == PG_QUERY__NODE__NODE_STRING ? last->string->sval : NULL;
    for (size_t i = 0; name && i < sizeof(volatile_funcs) / sizeof(volatile_funcs[0]); i++)
      if (strcmp(name, volatile_funcs[i]) == 0) hit->name = volatile_funcs[i];
  }
  const ProtobufCMessageDescriptor *d = m->descriptor;
  const char *base = (const char *)m;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && *(const uint32_t *)(base + f->quantifier_offset) != f->id) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      ProtobufCMessage *const *items = *(ProtobufCMessage *const *const *)(base + f->offset);
      for (size_t k = 0; k < n; k++) find_volatile(items[k], hit, depth + 1);
    } else {
      find_volatile(*(ProtobufCMessage *const *)(base + f->offset), hit, depth + 1);
    }
  }
}

/* Refuse a condition that calls a volatile function (it runs twice). */
static int check_condition(const PgQuery__Node *where, const char *verb, char *err, size_t errlen) {
  volatile_hit_t hit = {0};
  find_volatile((const ProtobufCMessage *)where, &hit, 0);
  if (hit.too_deep)
    return fail(err, errlen, RM_E_NOT_SUPPORTED, "%s: the condition is nested too deeply to check", verb);
  if (hit.name)
    return fail(err, errlen, RM_E_NOT_SUPPORTED,
                "%s with a condition that calls %s(): a volatile function runs once for the before image and "
                "again for the statement, and may pick other rows or act twice; compute it first and pass it "
                "as a parameter", verb, hit.name);
  return 0;
}

/* An UPDATE or a DELETE: one table, a condition, the before image. */
static int classify_change(const char *sql, PgQuery__Node *n, PgQuery__RangeVar *rel, PgQuery__Node *where,
                           size_t n_from, const char *verb, const char *from_word, size_t *n_returning,
                           PgQuery__Node ***returning, const PgQuery__WithClause *with,
                           const PgQuery__ParseResult *parsed, rm_sql_stmt_t *s, char *err, size_t errlen) {
  int rc = take_relation(s, rel, err, errlen);
  if (rc) return rc;
  if (with) return fail(err, errlen, RM_E_NOT_SUPPORTED, "%s with a WITH clause: a CTE may write", verb);
  if (n_from)
    return fail(err, errlen, RM_E_NOT_SUPPORTED,
                "%s \"%s\" ... %s another table: the rows it changes depend on that table; write it as %s ... "
                "WHERE key IN (SELECT ...)",
                verb, s->table, from_word, verb);
  if (!where)
    return fail(err, errlen, RM_E_NOT_SUPPORTED,
                "%s of \"%s\" without WHERE would image and lock every row of the table; write WHERE true if "
                "that is meant",
                verb, s->table);
  if (current_of(where))
    return fail(err, errlen, RM_E_NOT_SUPPORTED, "%s ... WHERE CURRENT OF: a cursor's row has no condition to image",
                verb);
  if ((rc = check_condition(where, verb, err, errlen)) != 0) return rc;
  s->returning = *n_returning > 0;
  if (s->kind == RM_SQL_UPDATE && ((rc = take_set_cols(n->update_stmt, s, err, errlen)) != 0 ||
                                   (rc = take_delta(n->update_stmt, s, err, errlen)) != 0))
    return rc;
  if ((rc = take_eqs(where, s, err, errlen)) != 0) return rc;
  if ((rc = image_query(parsed, rel, where, NULL, &s->image_sql, err, errlen)) != 0) return rc;
  return base_and_returning(sql, parsed, n, rel, n_returning, returning, s, err, errlen);
}

/* A WITH whose queries all read (PostgreSQL allows a writing CTE only at
 * the top level, so the top level is where to look). */
static bool with_writes(const PgQuery__WithClause *with) {
  for (size_t i = 0; with && i < with->n_ctes; i++) {
    const PgQuery__Node *c = with->ctes[i];
    if (c->node_case != PG_QUERY__NODE__NODE_COMMON_TABLE_EXPR || !c->common_table_expr->ctequery ||
        c->common_table_expr->ctequery->node_case != PG_QUERY__NODE__NODE_SELECT_STMT)
      return true;
  }
  return false;
}

static int classify_select(const PgQuery__SelectStmt *st, const PgQuery__ParseResult *parsed, rm_sql_stmt_t *s,
                           char *err, size_t errlen) {
  if (with_writes(st->with_clause))
    return fail(err, errlen, RM_E_NOT_SUPPORTED,
                "SELECT with a WITH clause that writes (INSERT, UPDATE or DELETE in a CTE): write each change as "
                "its own statement, so that each gets its images");
  if (st->n_locking_clause == 0) {
    s->kind = RM_SQL_READ;
    return 0;
  }
  if (st->n_locking_clause != 1 || st->locking_clause[0]->node_case != PG_QUERY__NODE__NODE_LOCKING_CLAUSE)
    return fail(err, errlen, RM_E_NOT_SUPPORTED, "SELECT with several locking clauses");
  const PgQuery__LockingClause *lc = st->locking_clause[0]->locking_clause;
  if (lc->strength != PG_QUERY__LOCK_CLAUSE_STRENGTH__LCS_FORUPDATE)
    return fail(err, errlen, RM_E_NOT_SUPPORTED,
                "SELECT ... FOR SHARE / FOR NO KEY UPDATE / FOR KEY SHARE: only FOR UPDATE checks the global locks");
  if (lc->wait_policy != PG_QUERY__LOCK_WAIT_POLICY__LockWaitBlock)
    return fail(err, errlen, RM_E_NOT_SUPPORTED, "SELECT ... FOR UPDATE NOWAIT / SKIP LOCKED is not supported");
  if (st->with_clause)
    return fail(err, errlen, RM_E_NOT_SUPPORTED, "SELECT ... FOR UPDATE with a WITH clause: one table only");
  if (st->op != PG_QUERY__SET_OPERATION__SETOP_NONE || st->n_from_clause != 1 ||
      st->from_clause[0]->node_case != PG_QUERY__NODE__NODE_RANGE_VAR)
    return fail(err, errlen, RM_E_NOT_SUPPORTED,
                "SELECT ... FOR UPDATE over a join, a subquery or several tables: one table only, so that each "
                "row returned is a row of that table");
  if (st->into_clause) return fail(err, errlen, RM_E_NOT_SUPPORTED, "SELECT INTO creates a table");
  int rc = take_relation(s, st->from_clause[0]->range_var, err, errlen);
  if (rc == 0 && st->where_clause) rc = check_condition(st->where_clause, "SELECT ... FOR UPDATE", err, errlen);
  if (rc) return rc;
  s->kind = RM_SQL_SELECT_FOR_UPDATE;
  /* The image is the rows it returns, keys and all: the same rows, every column. */
  return image_query(parsed, st->from_clause[0]->range_var, st->where_clause, st, &s->image_sql, err, errlen);
}

static int classify_tree(const char *sql, const PgQuery__ParseResult *pr, rm_sql_stmt_t *s, char *err, size_t errlen) {
  if (pr->n_stmts == 0) return fail(err, errlen, RM_E_INVALID, "no statement");
  if (pr->n_stmts > 1)
    return fail(err, errlen, RM_E_NOT_SUPPORTED, "%zu statements: one statement per call", pr->n_stmts);
  PgQuery__Node *n = pr->stmts[0]->stmt;
  switch (n ? n->node_case : PG_QUERY__NODE__NODE__NOT_SET) {
  case PG_QUERY__NODE__NODE_INSERT_STMT:
    return classify_insert(sql, n, pr, s, err, errlen);
  case PG_QUERY__NODE__NODE_UPDATE_STMT: {
    PgQuery__UpdateStmt *u = n->update_stmt;
    s->kind = RM_SQL_UPDATE;
    return classify_change(sql, n, u->relation, u->where_clause, u->n_from_clause, "UPDATE", "FROM",
                           &u->n_returning_list, &u->returning_list, u->with_clause, pr, s, err, errlen);
  }
  case PG_QUERY__NODE__NODE_DELETE_STMT: {
    PgQuery__DeleteStmt *d = n->delete_stmt;
    s->kind = RM_SQL_DELETE;
    return classify_change(sql, n, d->relation, d->where_clause, d->n_using_clause, "DELETE", "USING",
                           &d->n_returning_list, &d->returning_list, d->with_clause, pr, s, err, errlen);
  }
  case PG_QUERY__NODE__NODE_SELECT_STMT:
    return classify_select(n->select_stmt, pr, s, err, errlen);
  default:
    return fail(err, errlen, RM_E_NOT_SUPPORTED,
                "not an INSERT, UPDATE, DELETE or SELECT: a global transaction's branch changes rows only "
                "through those (DDL, COPY, MERGE, CALL and the like are refused)");
  }
}

int rm_sql_classify(const char *sql, rm_sql_stmt_t *out, char *err, size_t errlen) {
  if (!out) return RM_E_INVALID;
  memset(out, 0, sizeof(*out));
  if (!sql) return fail(err, errlen, RM_E_INVALID, "no statement");
  PgQueryProtobufParseResult r = pg_query_parse_protobuf(sql);
  int rc = 0;
  if (r.error) {
    rc = fail(err, errlen, RM_E_INVALID, "syntax error at position %d: %s", r.error->cursorpos, r.error->message);
    pg_query_free_protobuf_parse_result(r);
    return rc;
  }
  PgQuery__ParseResult *pr =
    pg_query__parse_result__unpack(NULL, r.parse_tree.len, (const uint8_t *)r.parse_tree.data);
  pg_query_free_protobuf_parse_result(r);
  if (!pr) return fail(err, errlen, RM_E_NOMEM, "out of memory");
  rc = classify_tree(sql, pr, out, err, errlen);
  pg_query__parse_result__free_unpacked(pr, NULL);
  if (rc == 0) rc = scan_params(sql, &out->nparams, NULL, 0, err, errlen);
  if (rc == 0 && out->image_sql && out->nparams > 0) {
    if (!(out->image_params = calloc((size_t)out->nparams, sizeof(bool))))
      rc = fail(err, errlen, RM_E_NOMEM, "out of memory");
    else
      rc = scan_params(out->image_sql, NULL, out->image_params, out->nparams, err, errlen);
  }
  if (rc != 0) rm_sql_stmt_clear(out);
  return rc;
}

/* ---------------------------------------------------------------- cache */

#define CACHE_BUCKETS 128

typedef struct cache_entry {
  struct cache_entry *next;
  char *sql;
  rm_sql_stmt_t stmt;
} cache_entry_t;

struct rm_sql_cache {
  pthread_mutex_t mu;
  size_t cap, n;
  cache_entry_t *buckets[CACHE_BUCKETS];
};

rm_sql_cache_t *rm_sql_cache_new(size_t cap) {
  rm_sql_cache_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  pthread_mutex_init(&c->mu, NULL);
  c->cap = cap;
  return c;
}

void rm_sql_cache_free(rm_sql_cache_t *c) {
  if (!c) return;
  for (size_t i = 0; i < CACHE_BUCKETS; i++) {
    for (cache_entry_t *e = c->buckets[i], *next; e; e = next) {
      next = e->next;
      rm_sql_stmt_clear(&e->stmt);
      free(e->sql);
      free(e);
    }
  }
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static size_t text_hash(const char *s) { return (size_t)txc_fnv1a_str(TXC_FNV_OFFSET, s); }

static cache_entry_t *cache_find(rm_sql_cache_t *c, size_t bucket, const char *sql) {
  for (cache_entry_t *e = c->buckets[bucket]; e; e = e->next)
    if (strcmp(e->sql, sql) == 0) return e;
  return NULL;
}

int rm_sql_cache_get(rm_sql_cache_t *c, const char *sql, const rm_sql_stmt_t **out, rm_sql_stmt_t *own,
                     char *err, size_t errlen) {
  memset(own, 0, sizeof(*own));
  *out = NULL;
  if (!sql) return fail(err, errlen, RM_E_INVALID, "no statement");
  size_t bucket = text_hash(sql) % CACHE_BUCKETS;
  if (c) {
    pthread_mutex_lock(&c->mu);
    cache_entry_t *e = cache_find(c, bucket, sql);
    pthread_mutex_unlock(&c->mu);
    if (e) {
      *out = &e->stmt;
      return 0;
    }
  }
  int rc = rm_sql_classify(sql, own, err, errlen); /* outside the lock: parsing is the slow part */
  if (rc != 0) return rc;
  *out = own;
  if (!c) return 0;
  cache_entry_t *e = calloc(1, sizeof(*e));
  if (!e || !(e->sql = strdup(sql))) {
    free(e);
    return 0; /* not cached, still classified */
  }
  pthread_mutex_lock(&c->mu);
  cache_entry_t *had = cache_find(c, bucket, sql);
  if (!had && c->n < c->cap) {
    e->stmt = *own; /* the entry takes what 'own' held */
    memset(own, 0, sizeof(*own));
    e->next = c->buckets[bucket];
    c->buckets[bucket] = e;
    c->n++;
    *out = &e->stmt;
    e = NULL;
  } else if (had) {
    *out = &had->stmt; /* another thread was first: its entry, ours is dropped by the caller's clear */
  }
  pthread_mutex_unlock(&c->mu);
  if (e) {
    free(e->sql);
    free(e);
  }
  return 0;
}
