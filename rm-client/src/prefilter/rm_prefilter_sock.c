/*
 * rm_prefilter_sock.c - see rm_prefilter_sock.h.
 */
#include "rm_prefilter_sock.h"

#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

bool rm__pf_self_connected(int fd) {
  struct sockaddr_storage local, peer;
  socklen_t llen = sizeof(local), plen = sizeof(peer);
  memset(&local, 0, sizeof(local));
  memset(&peer, 0, sizeof(peer));
  if (getsockname(fd, (struct sockaddr *)&local, &llen) != 0 ||
      getpeername(fd, (struct sockaddr *)&peer, &plen) != 0)
    return false;
  if (llen != plen || local.ss_family != peer.ss_family) return false;
  if (local.ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)&local, *b = (const struct sockaddr_in *)&peer;
    return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
  }
  if (local.ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&local, *b = (const struct sockaddr_in6 *)&peer;
    return a->sin6_port == b->sin6_port && memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(a->sin6_addr)) == 0;
  }
  return false; /* a Unix socket cannot connect to itself */
}
