/*
 * rm_prefilter_lua.h - the Redis scripts of lua/, embedded at build time.
 *
 * NOTES
 *   The table is generated (rm_prefilter_lua.c in the build tree) from
 *   the .lua files of lua/ by the embedding step of rm-client/CMakeLists.txt: one entry
 *   per script file, named after it without ".lua", its "--#include" lines
 *   already expanded.  The C side never holds Lua text of its own.
 */
#ifndef RM_PREFILTER_LUA_H
#define RM_PREFILTER_LUA_H

#include <stddef.h>

typedef struct rm_pf_lua {
  const char *name; /* "freeze", ... */
  const char *text;
  size_t len;
} rm_pf_lua_t;

extern const rm_pf_lua_t rm__pf_lua[];
extern const size_t rm__pf_lua_count;

#endif /* RM_PREFILTER_LUA_H */
