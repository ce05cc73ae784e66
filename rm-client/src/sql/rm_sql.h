/*
 * rm_sql.h - the first step of AT mode on plain SQL (issue 25): a
 * statement, parsed with the server's own grammar (libpg_query, the
 * PostgreSQL 15 parser), classified, and the query that reads its before
 * image built from its own table and WHERE clause.  Pure: no libpq, no I/O
 * (tests/unit/test_rm_sql.c; tests/fuzz/fuzz_sql.c).
 *
 * NOTES
 *   What is accepted, one statement only:
 *     INSERT INTO t [AS a] [(cols)] VALUES (...)[, (...)] [RETURNING ...]
 *     INSERT INTO t DEFAULT VALUES [RETURNING ...]
 *     UPDATE [ONLY] t [AS a] SET ... WHERE cond [RETURNING ...]
 *     DELETE FROM [ONLY] t [AS a] WHERE cond [RETURNING ...]
 *     SELECT ... FROM t [AS a] WHERE ... FOR UPDATE   (one table, no join)
 *     SELECT without a locking clause                  (a plain read)
 *   For an UPDATE or a DELETE, 'image_sql' is
 *     SELECT * FROM t [AS a] WHERE cond FOR UPDATE
 *   deparsed from the statement's own tree (not cut out of its text), so
 *   it sees exactly the rows the statement will change, with the same $n
 *   parameters.  'base_sql' is the statement without its RETURNING list
 *   (also deparsed), which the AT layer runs with a RETURNING list of its
 *   own ahead of the caller's 'returning_sql'.  'image_params' tells which of them it uses: PostgreSQL
 *   cannot infer the type of a parameter a query does not use, so the
 *   caller passes those as text.
 *
 *   Refused, each with a message that names what was found and why:
 *   several statements; a WITH clause (it may write); INSERT ... SELECT and
 *   ON CONFLICT (the rows or their fate are only known at run time);
 *   UPDATE ... FROM and DELETE ... USING (the rows changed depend on
 *   another table); WHERE CURRENT OF (a cursor's row has no condition to
 *   image); an UPDATE or DELETE without WHERE (it would image and lock the
 *   whole table: say WHERE true if that is meant); SELECT ... FOR UPDATE
 *   over a join, a subquery or several tables, or FOR SHARE and the like
 *   (only FOR UPDATE takes the global lock check); everything else (DDL,
 *   COPY, MERGE, CALL, ...); a condition that calls a volatile builtin
 *   (random(), nextval(), ...: it runs twice, for the image and for the
 *   statement) or is nested too deeply to check.  What only the database
 *   can tell (a table without a primary key; a volatile function of the
 *   user's own) is checked when the statement runs.
 */
#ifndef RM_SQL_H
#define RM_SQL_H

#include <stdbool.h>
#include <stddef.h>

typedef enum rm_sql_kind {
  RM_SQL_INSERT = 1,
  RM_SQL_UPDATE,
  RM_SQL_DELETE,
  RM_SQL_SELECT_FOR_UPDATE,
  RM_SQL_READ, /* a SELECT without a locking clause: runs as it is */
} rm_sql_kind_t;

/* The most parameters a statement may have ($1..$RM_SQL_MAX_PARAMS). */
#define RM_SQL_MAX_PARAMS 1000

/* A condition "col = $param" (or "col = value", param 0). */
typedef struct rm_sql_eq {
  char *col;
  int param;
  char *value;
} rm_sql_eq_t;

typedef struct rm_sql_stmt {
  rm_sql_kind_t kind;
  char *schema;     /* as written, NULL when unqualified */
  char *table;      /* as written (unquoted: "Odd Name" is Odd Name) */
  bool only;        /* ONLY t: inheritance children not included */
  int nrows;        /* insert: rows of VALUES (1 for DEFAULT VALUES) */
  bool returning;   /* has a RETURNING list */
  int nparams;      /* highest $n in the statement (0: none) */
  char *image_sql;  /* update, delete, select for update: the before image */
  bool *image_params; /* [nparams]: whether image_sql uses $(i+1) */
  /* insert, update, delete: */
  char *alias;         /* the table's alias, NULL when none */
  char *base_sql;      /* the statement without RETURNING, for the AT layer to add its own */
  char *returning_sql; /* the statement's RETURNING list ("a, b AS x"), NULL when none */
  int nset;            /* update: the columns SET names */
  char **set_cols;
  /* update of one column by an amount, SET c = c + X or c = c - X, X a
   * parameter or a number (a delta the AT layer may undo by the opposite
   * delta on a declared hot column): */
  char *delta_col;     /* NULL when the SET is not of that form */
  int delta_sign;      /* +1 or -1 */
  int delta_param;     /* X is $delta_param, or 0: X is delta_value */
  char *delta_value;
  /* update, delete: the WHERE's top-level "col = X" conjuncts (X a
   * parameter or a literal), and whether it has others (a guard) */
  int neq;
  rm_sql_eq_t *eqs;
  bool where_more;
} rm_sql_stmt_t;

/* Name of a kind ("insert", ...). */
const char *rm_sql_kind_name(rm_sql_kind_t kind);

/*
 * Parse and classify 'sql'.  0 with '*out' filled (free it with
 * rm_sql_stmt_clear); RM_E_INVALID for a syntax error (PostgreSQL's
 * message and position), RM_E_NOT_SUPPORTED for a statement it refuses
 * (NOTES), RM_E_NOMEM; then 'err' says why and '*out' holds nothing.
 */
int rm_sql_classify(const char *sql, rm_sql_stmt_t *out, char *err, size_t errlen);
void rm_sql_stmt_clear(rm_sql_stmt_t *s);

/*
 * A cache of classified statements by their text, so that a service's
 * statement is parsed once (thread-safe; entries never change once in).
 * Bounded: the first 'cap' distinct texts are kept, the later ones are
 * classified on each call.
 */
typedef struct rm_sql_cache rm_sql_cache_t;

#define RM_SQL_CACHE_CAP 256

rm_sql_cache_t *rm_sql_cache_new(size_t cap);
void rm_sql_cache_free(rm_sql_cache_t *c);

/*
 * 'sql' classified, as rm_sql_classify: 0 with *out the cached entry
 * (valid until rm_sql_cache_free), or, when the cache is full or NULL,
 * classified into 'own' with *out == own.  Either way call
 * rm_sql_stmt_clear(own) after use ('own' is zeroed here).  Refusals are
 * not cached.
 */
int rm_sql_cache_get(rm_sql_cache_t *c, const char *sql, const rm_sql_stmt_t **out, rm_sql_stmt_t *own,
                     char *err, size_t errlen);

#endif
