/*
 * rm_degrade.c - degrade detection (rm_client_degrade_enable, rm_client.h)
 * and the mode the services read (global or local).
 *
 * NOTES
 *   Once enabled, the loop thread runs one probe at a time, an internal
 *   GlobalStatus call of an xid that does not exist (RM_PROBE_XID) with the
 *   probe timeout as its deadline, routed like any call.  "Not found" (or
 *   any answer of a working node: RM_E_BUSY included) is a success; no
 *   answer in time, no node, or a store error is a failure.  The streaks of
 *   consecutive results decide the detected mode; the mode the services
 *   read is the forced one if any, else the detected one.  It is published
 *   in atomics (read from any thread without locking); changes of it are
 *   made under 'mode_mu' (so each switch is counted once) and logged after.
 *   A call that ends with RM_E_NO_NODE starts the next probe at once (at
 *   most one every RM_DEGRADE_MIN_GAP_MS).  With no node registered a
 *   probe fails at once, without waiting for one; calls then wait for a
 *   node at most the connect timeout, and a switch to local mode fails
 *   those still waiting (rm__calls_fail_waiting): no order is held longer
 *   than the connect timeout for want of a coordinator.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "rm_core.h"

#define RM_PROBE_XID "txc-degrade-probe" /* never an xid the TC made: no ':' */
#define RM_DEGRADE_FAILS 3u
#define RM_DEGRADE_RECOVERS 3u
#define RM_DEGRADE_INTERVAL_MS 1000u
#define RM_DEGRADE_MIN_GAP_MS 250u /* between probes that calls without a node ask for */
#define RM_DEGRADE_MAX_THRESHOLD 1000u
#define RM_DEGRADE_MAX_MS 3600000u

/* ------------------------------------------- detection (loop thread) */

/* Publish the mode the services read (forced, else detected), counting and
 * logging a switch.  Any thread. */
static void mode_update(rm_client_t *c, const char *why) {
  uv_mutex_lock(&c->mode_mu);
  int old = atomic_load(&c->mode);
  int forced = atomic_load(&c->forced);
  int now = forced != RM_MODE_AUTO ? forced : atomic_load(&c->detected);
  if (now != old) {
    atomic_store(&c->mode, now);
    atomic_fetch_add(now == RM_MODE_LOCAL ? &c->to_local : &c->to_global, 1);
  }
  uv_mutex_unlock(&c->mode_mu);
  if (now != old)
    RM_LOG_C(c, RM_LOG_WARN, "client \"%s\" switched from %s to %s mode: %s", c->client_id, rm_mode_name(old),
        rm_mode_name(now), why);
}

static void on_probe_timer(uv_timer_t *t);

/* Start the next probe after 'delay_ms' unless one is running. */
static void probe_schedule(rm_client_t *c, uint64_t delay_ms) {
  if (c->stopping || !c->dg_enabled || c->probe_inflight) return;
  uv_timer_start(&c->probe_timer, on_probe_timer, delay_ms, 0);
}

/* Probe now rather than at the next tick: detection was just enabled, or
 * a call failed for want of a node (so that a burst of failures is
 * noticed within one probe timeout).  The core calls it through
 * c->probe_soon (rm__probe_soon, rm_core.h). */
static void probe_now(rm_client_t *c) {
  uint64_t now = rm__mono_ms(), next = c->probe_last_ms + RM_DEGRADE_MIN_GAP_MS;
  probe_schedule(c, next > now ? next - now : 0);
}

static void on_probe_done(int code, const char *xid, int status, void *arg) {
  rm_client_t *c = arg;
  (void)xid;
  (void)status;
  c->probe_inflight = false;
  if (c->stopping) return; /* completed by the shutdown: not a result */
  /* Any answer from a working node counts; "not found" is the expected one. */
  bool ok = code == 0 || code == RM_E_GLOBAL_NOT_FOUND || code == RM_E_BUSY;
  atomic_fetch_add(&c->probes, 1);
  char why[192];
  if (ok) {
    unsigned n = atomic_fetch_add(&c->ok_streak, 1) + 1;
    atomic_store(&c->fail_streak, 0);
    if (n >= c->dg.recover_threshold && atomic_load(&c->detected) != RM_MODE_GLOBAL) {
      atomic_store(&c->detected, RM_MODE_GLOBAL);
      snprintf(why, sizeof(why), "a coordinator answered %u consecutive probes", n);
      mode_update(c, why);
    }
  } else {
    atomic_fetch_add(&c->probe_failures, 1);
    unsigned n = atomic_fetch_add(&c->fail_streak, 1) + 1;
    atomic_store(&c->ok_streak, 0);
    RM_LOG_C(c, RM_LOG_DEBUG, "degrade probe failed (%u in a row): %s", n, rm_strerror(code));
    if (n >= c->dg.fail_threshold && atomic_load(&c->detected) != RM_MODE_LOCAL) {
      atomic_store(&c->detected, RM_MODE_LOCAL);
      snprintf(why, sizeof(why), "no coordinator answered %u consecutive probes within %u ms (last: %s)", n,
               c->dg.probe_timeout_ms, rm_strerror(code));
      mode_update(c, why);
      /* what waits for a node now would wait in vain: its callers take
       * the local path at once */
      if (atomic_load(&c->mode) == RM_MODE_LOCAL) rm__calls_fail_waiting(c);
    }
  }
  probe_schedule(c, c->dg.probe_interval_ms);
}

/* Send one probe: an internal call completed through on_probe_done. */
static void on_probe_timer(uv_timer_t *t) {
  rm_client_t *c = t->data;
  if (c->stopping || !c->dg_enabled || c->probe_inflight) return;
  c->probe_last_ms = rm__mono_ms();
  if (atomic_load(&c->nodes_up) == 0 &&
      (c->ever_up || c->probe_last_ms >= c->created_ms + c->cfg.connect_timeout_ms)) {
    /* No node is registered (and this is not a client still making its
     * first connections): the probe fails now rather than after waiting
     * for one, so that a client with every coordinator gone switches
     * within about fail_threshold probe intervals, the seed's 3 s. */
    c->probe_inflight = true;
    on_probe_done(RM_E_NO_NODE, NULL, 0, c);
    return;
  }
  rm_call_t *k = rm__call_new(TXP_MSG_GLOBAL_STATUS, true, c->dg.probe_timeout_ms);
  if (!k) {
    probe_schedule(c, c->dg.probe_interval_ms);
    return;
  }
  snprintf(k->xid, sizeof(k->xid), "%s", RM_PROBE_XID);
  k->cb = on_probe_done;
  k->cb_arg = c;
  uv_mutex_lock(&c->mu);
  c->live++; /* rm__call_complete counts it out like a submitted call */
  uv_mutex_unlock(&c->mu);
  c->probe_inflight = true;
  rm__call_start(c, k);
  rm__call_arm_timer(c);
}

/* ------------------------------------------- public: degrade, modes */

const char *rm_mode_name(int mode) {
  switch (mode) {
  case RM_MODE_AUTO: return "auto";
  case RM_MODE_GLOBAL: return "global";
  case RM_MODE_LOCAL: return "local";
  default: return "?";
  }
}

int rm_mode_parse(const char *s) {
  if (!s || !s[0]) return RM_MODE_AUTO;
  if (strcasecmp(s, "auto") == 0) return RM_MODE_AUTO;
  if (strcasecmp(s, "global") == 0) return RM_MODE_GLOBAL;
  if (strcasecmp(s, "local") == 0) return RM_MODE_LOCAL;
  return RM_E_INVALID;
}

int rm_client_degrade_enable(rm_client_t *c, const rm_degrade_opts_t *opts) {
  rm_degrade_opts_t o = {0};
  if (!c) return RM_E_INVALID;
  if (opts) o = *opts;
  if (o.fail_threshold > RM_DEGRADE_MAX_THRESHOLD || o.recover_threshold > RM_DEGRADE_MAX_THRESHOLD ||
      o.probe_interval_ms > RM_DEGRADE_MAX_MS || o.probe_timeout_ms > RM_DEGRADE_MAX_MS)
    return RM_E_INVALID;
  if (!o.fail_threshold) o.fail_threshold = RM_DEGRADE_FAILS;
  if (!o.recover_threshold) o.recover_threshold = RM_DEGRADE_RECOVERS;
  if (!o.probe_interval_ms) o.probe_interval_ms = RM_DEGRADE_INTERVAL_MS;
  if (!o.probe_timeout_ms) o.probe_timeout_ms = c->cfg.connect_timeout_ms;
  uv_mutex_lock(&c->mu);
  if (c->stop_requested) {
    uv_mutex_unlock(&c->mu);
    return RM_E_CONN_LOST;
  }
  c->dg_req = o;
  c->dg_changed = true;
  atomic_store(&c->probe_soon, probe_now);
  uv_async_send(&c->async);
  uv_mutex_unlock(&c->mu);
  atomic_store(&c->dg_on, true);
  RM_LOG_C(c, RM_LOG_INFO, "degrade detection on: local mode after %u failed probes, global after %u answered "
      "(one every %u ms, %u ms each)", o.fail_threshold, o.recover_threshold, o.probe_interval_ms,
      o.probe_timeout_ms);
  return 0;
}

int rm_client_mode(rm_client_t *c) { return c ? atomic_load(&c->mode) : RM_MODE_GLOBAL; }

int rm_client_force_mode(rm_client_t *c, int mode) {
  if (!c || (mode != RM_MODE_AUTO && mode != RM_MODE_GLOBAL && mode != RM_MODE_LOCAL)) return RM_E_INVALID;
  int old = atomic_exchange(&c->forced, mode);
  if (old != mode)
    RM_LOG_C(c, RM_LOG_WARN, "client \"%s\": mode %s by the operator", c->client_id,
        mode == RM_MODE_AUTO ? "left to detection" : mode == RM_MODE_LOCAL ? "forced to local" : "forced to global");
  mode_update(c, mode == RM_MODE_AUTO ? "forcing ended" : "forced by the operator");
  return 0;
}

void rm__degrade_stats(rm_client_t *c, rm_degrade_stats_t *out) {
  memset(out, 0, sizeof(*out));
  if (!c) {
    out->mode = out->detected = RM_MODE_GLOBAL;
    return;
  }
  out->mode = atomic_load(&c->mode);
  out->forced = atomic_load(&c->forced);
  out->detected = atomic_load(&c->detected);
  out->enabled = atomic_load(&c->dg_on);
  out->to_local = atomic_load(&c->to_local);
  out->to_global = atomic_load(&c->to_global);
  out->probes = atomic_load(&c->probes);
  out->probe_failures = atomic_load(&c->probe_failures);
  out->fail_streak = atomic_load(&c->fail_streak);
  out->ok_streak = atomic_load(&c->ok_streak);
}

