/*
 * rm_redis_sentinel.h - finding the Redis master through Sentinel, and
 * telling one master from another: the one resolver of the library (the
 * prefilter's pool and the public rm_redis_resolve use it).
 *
 * NOTES
 *   Resolution follows the Sentinel client guidelines
 *   (https://redis.io/docs/latest/develop/reference/sentinel-clients/):
 *     1. ask the sentinels in turn, starting with the one that answered
 *        last, "SENTINEL get-master-addr-by-name NAME"; the first that
 *        answers an address wins (one that is down, slow or does not know
 *        the name is skipped);
 *     2. connect to that address and require ROLE "master": right after a
 *        failover a sentinel may still name the old master, which, if it
 *        is alive, is a replica now (writes would fail with READONLY);
 *     3. the master's run_id (INFO server) is its identity: a new address
 *        or a new run_id means another master (a failover, or a restart
 *        that may have lost the last second of writes).
 *   Every step is bounded: each connect by 'connect_ms', each reply by
 *   'cmd_ms' (SO_RCVTIMEO/SO_SNDTIMEO), so a resolution costs at most
 *   nsentinels x (connect_ms + cmd_ms) plus one connect to the master,
 *   whatever the network does.  Addresses are used as given (IP literals
 *   avoid hiredis's blocking getaddrinfo).
 */
#ifndef RM_REDIS_SENTINEL_H
#define RM_REDIS_SENTINEL_H

#include <stdbool.h>

#include <hiredis/hiredis.h>

#include "rm_prefilter_keys.h"

#define RM_REDIS_RUN_ID_MAX 41 /* 40 hex digits and the NUL */

/* Ask the sentinels of 'u' (u->nsentinels >= 1) in turn, starting at
 * '*next' (then the index of the one that answered), for the address of
 * master u->master_name.  0 and '*out'; RM_E_REDIS_NO_MASTER when none
 * answered one (rm__pf_errf says what each did). */
int rm__sentinel_ask(const rm_pf_url_t *u, unsigned connect_ms, unsigned cmd_ms, unsigned *next,
                     rm_pf_hostport_t *out);

/* Parse the replies of ROLE and INFO server: 0 when ROLE says master
 * (and 'run_id' gets INFO's run_id, "" if absent); -1 otherwise, with
 * 'role' (cap 16) naming what it said. */
int rm__redis_parse_identity(const redisReply *role_reply, const redisReply *info_reply,
                             char run_id[RM_REDIS_RUN_ID_MAX], char *role, size_t rolecap);

#endif /* RM_REDIS_SENTINEL_H */
