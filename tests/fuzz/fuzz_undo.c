/*
 * fuzz_undo.c - libFuzzer target for the undo row's decoders
 * (rm-client/src/at/rm_image.h): undo_log.context and
 * undo_log.rollback_info as phase two reads them from the RM's database,
 * where anyone with write access to undo_log can put any text.
 *
 * The input is split at its first NUL byte: the context string, then the
 * rollback_info text.  Whatever the bytes: no crash, no leak; an accepted
 * context has a known version and at most RM_CTX_MAX_SETTINGS settings;
 * accepted items, in either form, are consistent (a known op, schema, table
 * and a non-empty key; the images, digest and delta its op needs), encode
 * again (the compact form), and decode to the same items, whose digest
 * heads still match; a dirty-write message about any of them stays
 * within its buffer.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "rm_image.h"

static void check_item(const rm_item_t *it) {
  CHECK(it->op >= RM_OP_INSERT && it->op <= RM_OP_COMMIT_DELTA);
  CHECK(it->schema && it->schema[0] && it->table && it->table[0]);
  CHECK(it->pk && it->pk->n >= 1);
  for (int i = 0; i < it->pk->n; i++) CHECK(it->pk->names[i] && it->pk->vals[i]);
  if (it->op == RM_OP_INSERT) CHECK((it->after != NULL) != (it->digest != NULL));
  if (it->op == RM_OP_UPDATE) CHECK(it->before && it->after);
  if (it->op == RM_OP_DELETE) CHECK(it->before);
  if (it->op == RM_OP_DELTA || it->op == RM_OP_COMMIT_DELTA) CHECK(it->col && it->col[0]);
  if (it->digest) CHECK(strlen(it->digest) >= RM_ROW_DIGEST_KEPT && strlen(it->digest) <= RM_ROW_DIGEST_MAX);
  char msg[256];
  msg[sizeof(msg) - 1] = 'x';
  rm_dirty_message(msg, sizeof(msg) - 1, it, "after", it->after, it->before, NULL, 0);
  CHECK(strlen(msg) < sizeof(msg) - 1 && msg[sizeof(msg) - 1] == 'x');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 16384) return 0;
  char *buf = malloc(size + 2);
  if (!buf) return 0;
  memcpy(buf, data, size);
  buf[size] = buf[size + 1] = '\0';
  const char *ctx_text = buf, *info = buf + strlen(buf) + 1;
  if (info > buf + size) info = buf + size; /* no NUL: no rollback_info */

  rm_ctx_t ctx;
  if (rm_ctx_parse(ctx_text, &ctx) == 0) {
    CHECK(ctx.nsettings >= 0 && ctx.nsettings <= RM_CTX_MAX_SETTINGS);
    for (int i = 0; i < ctx.nsettings; i++) CHECK(ctx.names[i] && ctx.values[i]);
    rm_ctx_clear(&ctx);
  }

  rm_item_t *items = NULL;
  size_t n = 0;
  char err[256];
  if (rm_undo_decode(info, &items, &n, err, sizeof(err)) == 0) {
    for (size_t i = 0; i < n; i++) check_item(&items[i]);
    char *again = rm_undo_encode(items, n);
    if (again) { /* NULL only on allocation failure or a value that is not UTF-8 */
      rm_item_t *back = NULL;
      size_t m = 0;
      CHECK(rm_undo_decode(again, &back, &m, err, sizeof(err)) == 0);
      CHECK(m == n);
      for (size_t i = 0; i < m; i++) {
        CHECK(back[i].op == items[i].op && strcmp(back[i].table, items[i].table) == 0);
        CHECK(strcmp(back[i].schema, items[i].schema) == 0);
        CHECK((back[i].digest == NULL) == (items[i].digest == NULL));
        /* the compact form keeps the digest's head: it still matches */
        if (items[i].digest) CHECK(rm_digest_matches(back[i].digest, items[i].digest));
        CHECK(back[i].delta == items[i].delta);
      }
      rm_undo_free(back, m);
      free(again);
    }
    rm_undo_free(items, n);
  } else {
    CHECK(items == NULL && n == 0);
  }
  free(buf);
  return 0;
}
