/*
 * txp_msg.h - the coordinator wire protocol: frames, messages and the codec.
 *
 * NOTES
 *   A frame is a fixed 20-byte header followed by a msgpack body:
 *
 *     off size field
 *       0    2 magic        0xDA 0xDA
 *       2    1 ver_major    TXP_VERSION_MAJOR; another major is refused
 *       3    1 ver_minor    informational; newer minors are accepted
 *       4    2 type         txp_msg_type_t
 *       6    2 flags        TXP_FLAG_*
 *       8    8 request_id   chosen by the requester, echoed in the response
 *      16    4 body_len     bytes of msgpack that follow (<= max_frame)
 *   All integers are big-endian.
 *
 *   The body is a msgpack map from small integer field keys (txp_field_t) to
 *   values.  Which fields a message type requires and allows is a table in
 *   txp_msg.c: encoder and decoder both read it, so the format is written
 *   down once.  Unknown keys are skipped (a newer minor may add fields);
 *   duplicate keys, wrong types and over-long values are errors.
 *
 *   Every response is a *_RESULT type with the same request_id, carrying
 *   "code" (0 or a txp_errno_t) and, on failure, "message".
 *
 *   Ownership: txp_msg_t fields of string type are NUL-terminated.  A decoded
 *   message owns its strings (one allocation, released by txp_msg_clear).  A
 *   message built for encoding borrows whatever the caller points at.
 *
 * Thread safety: none needed; a decoder belongs to one connection.
 */
#ifndef TXP_MSG_H
#define TXP_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "txp_errno.h"
#include "txp_status.h"

#define TXP_MAGIC 0xDADAu
#define TXP_VERSION_MAJOR 1
#define TXP_VERSION_MINOR 0
#define TXP_HEADER_SIZE 20

/* Defaults for txp_limits_t. */
#define TXP_DEFAULT_MAX_FRAME (1024u * 1024u)
#define TXP_DEFAULT_MAX_STRING (256u * 1024u)
#define TXP_DEFAULT_MAX_COUNT 64u
#define TXP_DEFAULT_MAX_DEPTH 4u

/* Field length limits that are part of the protocol, whatever the limits. */
#define TXP_MAX_XID_LEN 128
#define TXP_MAX_NAME_LEN 128
#define TXP_MAX_RESOURCE_LEN 256
#define TXP_MAX_TOKEN_LEN 256
#define TXP_MAX_IDEM_LEN 64
#define TXP_MAX_MESSAGE_LEN 1024
#define TXP_MAX_LOCK_KEYS_LEN (64u * 1024u)
#define TXP_MAX_APP_DATA_LEN (64u * 1024u)

/* The application data of a BranchRegister whose branch does real work in
 * phase-two commit (an AT branch with commit-time deltas, which give
 * capacity back): the TC answers the GlobalCommit of its global only once
 * its branches were told to commit and answered, so that when the TM hears
 * "committed" the give-back is applied (an AT commit is otherwise answered
 * at the decision, its phase two being clean-up only).  A branch that
 * cannot be reached keeps the global CommitRetrying; the TM is answered
 * Committed then too: the decision stands. */
#define TXP_APP_DATA_PHASE2_SYNC "txc:phase2=sync"
#define TXP_MAX_RESOURCE_IDS_LEN 4096

enum {
  TXP_FLAG_RESPONSE = 1u << 0, /* this frame answers request_id */
  TXP_FLAG_ONEWAY = 1u << 1,   /* no response expected */
  TXP_FLAGS_KNOWN = TXP_FLAG_RESPONSE | TXP_FLAG_ONEWAY,
};

/* X(NAME, code) for each message type; *_RESULT answers the one before. */
#define TXP_MSG_TYPE_MAP(X)            \
  X(ERROR, 1)                          \
  X(HEARTBEAT, 2)                      \
  X(HEARTBEAT_RESULT, 3)               \
  X(REGISTER_TM, 10)                   \
  X(REGISTER_TM_RESULT, 11)            \
  X(REGISTER_RM, 12)                   \
  X(REGISTER_RM_RESULT, 13)            \
  X(GLOBAL_BEGIN, 20)                  \
  X(GLOBAL_BEGIN_RESULT, 21)           \
  X(GLOBAL_COMMIT, 22)                 \
  X(GLOBAL_COMMIT_RESULT, 23)          \
  X(GLOBAL_ROLLBACK, 24)               \
  X(GLOBAL_ROLLBACK_RESULT, 25)        \
  X(GLOBAL_STATUS, 26)                 \
  X(GLOBAL_STATUS_RESULT, 27)          \
  X(GLOBAL_REPORT, 28)                 \
  X(GLOBAL_REPORT_RESULT, 29)          \
  X(BRANCH_REGISTER, 30)               \
  X(BRANCH_REGISTER_RESULT, 31)        \
  X(BRANCH_REPORT, 32)                 \
  X(BRANCH_REPORT_RESULT, 33)          \
  X(GLOBAL_LOCK_QUERY, 34)             \
  X(GLOBAL_LOCK_QUERY_RESULT, 35)      \
  X(BRANCH_COMMIT, 40)                 \
  X(BRANCH_COMMIT_RESULT, 41)          \
  X(BRANCH_ROLLBACK, 42)               \
  X(BRANCH_ROLLBACK_RESULT, 43)        \
  X(UNDO_LOG_DELETE, 44)               \
  X(UNDO_LOG_DELETE_RESULT, 45)

typedef enum txp_msg_type {
  TXP_MSG_NONE = 0,
#define TXP__MSG_ENUM(name, code) TXP_MSG_##name = (code),
  TXP_MSG_TYPE_MAP(TXP__MSG_ENUM)
#undef TXP__MSG_ENUM
  TXP_MSG__MAX = 46
} txp_msg_type_t;

/* Body fields: X(NAME, key, kind, member, max_len).  'kind' is one of STR,
 * I64, U32, BOOL; max_len applies to STR (bytes, without the NUL). */
#define TXP_FIELD_MAP(X)                                                   \
  X(CODE, 1, I64, code, 0)                                                 \
  X(MESSAGE, 2, STR, message, TXP_MAX_MESSAGE_LEN)                         \
  X(XID, 3, STR, xid, TXP_MAX_XID_LEN)                                     \
  X(BRANCH_ID, 4, I64, branch_id, 0)                                       \
  X(TIMEOUT_MS, 5, U32, timeout_ms, 0)                                     \
  X(NAME, 6, STR, name, TXP_MAX_NAME_LEN)                                  \
  X(GLOBAL_STATUS, 7, U32, global_status, 0)                               \
  X(BRANCH_STATUS, 8, U32, branch_status, 0)                               \
  X(BRANCH_TYPE, 9, U32, branch_type, 0)                                   \
  X(RESOURCE_ID, 10, STR, resource_id, TXP_MAX_RESOURCE_LEN)               \
  X(LOCK_KEYS, 11, STR, lock_keys, TXP_MAX_LOCK_KEYS_LEN)                  \
  X(APP_DATA, 12, STR, application_data, TXP_MAX_APP_DATA_LEN)             \
  X(LOCK_WAIT_MS, 13, U32, lock_wait_ms, 0)                                \
  X(WAITED_MS, 14, U32, waited_ms, 0)                                      \
  X(IDEM_KEY, 15, STR, idem_key, TXP_MAX_IDEM_LEN)                         \
  X(APP_ID, 16, STR, application_id, TXP_MAX_NAME_LEN)                     \
  X(TOKEN, 17, STR, token, TXP_MAX_TOKEN_LEN)                              \
  X(RESOURCE_IDS, 18, STR, resource_ids, TXP_MAX_RESOURCE_IDS_LEN)         \
  X(CLIENT_ID, 19, STR, client_id, TXP_MAX_NAME_LEN)                       \
  X(NODE_ID, 20, U32, node_id, 0)                                          \
  X(LOCKABLE, 21, BOOL, lockable, 0)                                       \
  X(HEARTBEAT_MS, 22, U32, heartbeat_ms, 0)                                \
  X(SERVER_VERSION, 23, STR, server_version, TXP_MAX_NAME_LEN)             \
  X(SAVE_DAYS, 24, U32, save_days, 0)                                      \
  X(LOCK_HOLDER, 25, STR, lock_holder, TXP_MAX_XID_LEN)                    \
  X(FIRST_SEND, 26, BOOL, first_send, 0)

typedef enum txp_field {
#define TXP__FIELD_ENUM(name, key, kind, member, maxlen) TXP_F_##name = (key),
  TXP_FIELD_MAP(TXP__FIELD_ENUM)
#undef TXP__FIELD_ENUM
  TXP_F__MAX = 27
} txp_field_t;

#define TXP_FIELD_BIT(f) (UINT64_C(1) << (f))

/*
 * One decoded or to-be-encoded message.  'present' has TXP_FIELD_BIT(f) set
 * for each field carried; txp_msg_set_* helpers keep it in step.  When
 * encoding, a field is written iff its bit is set (and the type allows it).
 */
typedef struct txp_msg {
  uint16_t type;       /* txp_msg_type_t */
  uint16_t flags;      /* TXP_FLAG_* */
  uint64_t request_id;
  uint8_t ver_major;   /* as received; set by the encoder */
  uint8_t ver_minor;
  uint64_t present;    /* TXP_FIELD_BIT set */

  int64_t code;
  char *message;
  char *xid;
  int64_t branch_id;
  uint32_t timeout_ms;
  char *name;
  uint32_t global_status;
  uint32_t branch_status;
  uint32_t branch_type;
  char *resource_id;
  char *lock_keys;
  char *application_data;
  uint32_t lock_wait_ms;
  uint32_t waited_ms;
  char *idem_key;
  char *application_id;
  char *token;
  char *resource_ids;
  char *client_id;
  uint32_t node_id;
  bool lockable;
  uint32_t heartbeat_ms;
  char *server_version;
  uint32_t save_days;
  char *lock_holder;
  /* GlobalBegin: true on the first send of this idempotency key (never a
   * resend), so the coordinator may answer before it stores the begin
   * (tc/tc_hold.h).  Absent: it may be a resend. */
  bool first_send;

  void *owned_; /* private: string storage of a decoded message */
} txp_msg_t;

typedef struct txp_limits {
  uint32_t max_frame;  /* body bytes; default TXP_DEFAULT_MAX_FRAME */
  uint32_t max_string; /* any string value; default TXP_DEFAULT_MAX_STRING */
  uint32_t max_count;  /* entries of one map/array; default TXP_DEFAULT_MAX_COUNT */
  uint32_t max_depth;  /* container nesting; default TXP_DEFAULT_MAX_DEPTH */
} txp_limits_t;

/* Fill 'l' with the defaults. */
void txp_limits_default(txp_limits_t *l);

/* ---- messages ---- */

/* Zero 'm' and set its type. */
void txp_msg_init(txp_msg_t *m, txp_msg_type_t type);
/* Release what a decoded message owns and zero it.  Safe on an init'ed or
 * already-cleared message. */
void txp_msg_clear(txp_msg_t *m);

/* Setters that also mark the field present.  Strings are borrowed. */
void txp_msg_set_str(txp_msg_t *m, txp_field_t f, const char *value);
void txp_msg_set_int(txp_msg_t *m, txp_field_t f, int64_t value);
bool txp_msg_has(const txp_msg_t *m, txp_field_t f);

/* Build the result frame for request 'req': type = req->type + 1, same
 * request id, RESPONSE flag, code set.  'message' (may be NULL) is borrowed. */
void txp_msg_init_result(txp_msg_t *res, const txp_msg_t *req, int code, const char *message);

const char *txp_msg_type_name(int type);
/* True for request types that have a *_RESULT answer. */
bool txp_msg_type_is_request(int type);
bool txp_msg_type_valid(int type);
const char *txp_field_name(int field);

/* ---- encoding ---- */

/* A growable output buffer; bounded by 'cap' (0 = unbounded). */
typedef struct txp_buf {
  char *data;
  size_t len;
  size_t alloc;
  size_t cap;
} txp_buf_t;

void txp_buf_init(txp_buf_t *b, size_t cap);
void txp_buf_free(txp_buf_t *b);
void txp_buf_reset(txp_buf_t *b);
/* Drop the first 'n' bytes. */
void txp_buf_consume(txp_buf_t *b, size_t n);
/* Append 'len' bytes; keeps a NUL after the data (not counted in len) so
 * text built with it is a C string.  Returns 0, TXP_EBUFFER_FULL or
 * TXP_ENOMEM (nothing appended on error). */
int txp_buf_append(txp_buf_t *b, const void *data, size_t len);
int txp_buf_append_str(txp_buf_t *b, const char *s);

/*
 * Append one frame for 'm' to 'out'.  Checks that every field the type
 * requires is present, that no field outside the type's set is present, that
 * strings are within their limits, valid UTF-8 and free of NUL, and that the
 * body fits 'max_frame' (0 = TXP_DEFAULT_MAX_FRAME), and that enum fields
 * hold known values.  On error nothing is appended.  Returns 0,
 * TXP_EFIELD_MISSING, TXP_EFIELD_TOO_LONG, TXP_EFIELD_TYPE (also for an
 * out-of-range status or type), TXP_EUNKNOWN_TYPE, TXP_EBAD_FLAGS,
 * TXP_EFRAME_TOO_BIG, TXP_EBUFFER_FULL or TXP_ENOMEM.
 */
int txp_encode(const txp_msg_t *m, txp_buf_t *out, uint32_t max_frame);

/* ---- decoding ---- */

typedef struct txp_decoder txp_decoder_t;

/* 'limits' is copied; NULL means defaults.  NULL on allocation failure. */
txp_decoder_t *txp_decoder_new(const txp_limits_t *limits);
void txp_decoder_free(txp_decoder_t *d);

/*
 * Copy 'len' bytes of stream into the decoder.  The decoder holds at most
 * one frame plus TXP_DECODER_SLACK bytes: drain with txp_decoder_next()
 * after every feed.  Returns 0, TXP_EBUFFER_FULL or TXP_ENOMEM.
 */
#define TXP_DECODER_SLACK (256u * 1024u)
int txp_decoder_feed(txp_decoder_t *d, const char *buf, size_t len);

/*
 * Take the next whole message out of the decoder into 'out' (which must be
 * init'ed or cleared; the caller clears it after use).  Returns:
 *   0              a message is in 'out'
 *   TXP_EAGAIN     not enough bytes yet
 *   a body error   (TXP_EMALFORMED, TXP_EUNKNOWN_TYPE, TXP_EFIELD_*,
 *                  TXP_ELIMIT, TXP_EBAD_FLAGS): the frame is skipped and the
 *                  stream stays usable; out->type, flags and request_id are
 *                  set from the header so that the caller can answer it.
 *   a stream error (TXP_EBAD_MAGIC, TXP_EBAD_VERSION, TXP_EFRAME_TOO_BIG):
 *                  the decoder is poisoned and returns the same error from
 *                  now on; for TXP_EBAD_VERSION out's header fields are set.
 *   TXP_ENOMEM.
 */
int txp_decoder_next(txp_decoder_t *d, txp_msg_t *out);

/* Bytes buffered and not yet consumed. */
size_t txp_decoder_buffered(const txp_decoder_t *d);
/* Bytes allocated for buffering now: back to 0 once a frame larger than
 * TXP_DECODER_KEEP was consumed and nothing is left over. */
#define TXP_DECODER_KEEP (64u * 1024u)
size_t txp_decoder_capacity(const txp_decoder_t *d);

/* Decode exactly one complete frame held in 'buf' (convenience for tests
 * and tools).  Returns as txp_decoder_next, with TXP_EAGAIN if incomplete. */
int txp_decode_frame(const char *buf, size_t len, const txp_limits_t *limits, txp_msg_t *out);

#endif /* TXP_MSG_H */
