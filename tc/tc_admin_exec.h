/*
 * tc_admin_exec.h - the admin commands (tc_admin_exec.c): what each one
 * reads or repairs, given to the admin socket as its executor.  Loop
 * thread only.
 */
#ifndef TC_ADMIN_EXEC_H
#define TC_ADMIN_EXEC_H

#include "tc_admin.h"

/* Run 'req' (a tc_admin_exec_fn): answers through tc__admin_finish,
 * exactly once, possibly later. */
void tc__admin_execute(tc_adm_req_t *req);

#endif /* TC_ADMIN_EXEC_H */
