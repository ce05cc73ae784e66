/*
 * txp_errno.c - lookups over the error table in txp_errno.h.
 */
#include "txp_errno.h"

#include <stddef.h>

typedef struct {
  int code;
  bool retryable;
  const char *name;
  const char *msg;
} txp_err_entry_t;

static const txp_err_entry_t err_table[] = {
#define TXP__ERR_ROW(name, val, retry, msg) {(val), (retry), #name, (msg)},
  TXP_ERRNO_MAP(TXP__ERR_ROW)
#undef TXP__ERR_ROW
};

static const txp_err_entry_t *find(int code) {
  for (size_t i = 0; i < sizeof(err_table) / sizeof(err_table[0]); i++)
    if (err_table[i].code == code) return &err_table[i];
  return NULL;
}

const char *txp_strerror(int code) {
  if (code == 0) return "success";
  const txp_err_entry_t *e = find(code);
  if (e) return e->msg;
  return code < 0 && code > -4096 ? "system error" : "unknown error";
}

const char *txp_errname(int code) {
  if (code == 0) return "OK";
  const txp_err_entry_t *e = find(code);
  return e ? e->name : "UNKNOWN";
}

bool txp_err_retryable(int code) {
  const txp_err_entry_t *e = find(code);
  return e ? e->retryable : false;
}

bool txp_err_known(int code) { return code == 0 || find(code) != NULL; }
