#!/usr/bin/env bash
# test_install.sh - what `make install` (cmake --install) puts where, and
# the man pages (issue 27, its first part).
#
#   1. DESTDIR=ROOT cmake --install BUILD --prefix /usr: the executables
#      (tcd in sbin; tcctl, txc-compensate, txc-db-migrate in bin), the
#      library with its header, .pc and CMake files, the tc and rm schema
#      sets, the five man pages, the systemd unit and tmpfiles entry, and
#      the example configuration in /etc/txc (the prefix /usr: FHS);
#   2. the installed tcd runs (--version) and reads its own example
#      configuration back unchanged (--print-config of it is it); the
#      installed txc-db-migrate finds the tc set beside itself and applies
#      it to a scratch database of TC_PG_URL's server;
#   3. every man page renders without a warning (groff -man -ww), and
#      tcd.ini(5) names every setting `tcd --print-config` knows, so that
#      a new setting without its page fails here.
#
# Needs TX_SOURCE_DIR, TX_BUILD_DIR and TC_PG_URL (scripts/with-servers
# --pg), set by ctest.
set -euo pipefail

src=${TX_SOURCE_DIR:?TX_SOURCE_DIR not set}
build=${TX_BUILD_DIR:?TX_BUILD_DIR not set}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_install.XXXXXX")
db=
cleanup() {
  [[ -z $db ]] || psql -X -q -d "$TC_PG_URL" -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# check.sh for check_every; this test keeps its own ok and check, which
# count the passed checks as well (defined after it, so they are the ones
# check_every calls).
# shellcheck source=tests/integration/check.sh
. "$src/tests/integration/check.sh"
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   - $1"; }
bad() { failed=$((failed + 1)); echo "FAIL - $1"; [[ -z ${2:-} ]] || printf '%s\n' "$2" | sed 's/^/       /'; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

# ---- 1. install ----
root=$tmp/root
DESTDIR=$root cmake --install "$build" --prefix /usr >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; bad "cmake --install"; exit 1; }
ok "cmake --install into a DESTDIR"
u=$root/usr
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:[A-Z]*=//p' "$build/CMakeCache.txt")
libdir=${libdir:-lib}
missing=()
for f in sbin/tcd bin/tcctl bin/txc-compensate bin/txc-db-migrate \
  include/rm_client.h "$libdir/pkgconfig/rmclient.pc" "$libdir/cmake/rmclient/rmclientConfig.cmake" \
  share/txc/sql/tc/001_store.sql share/txc/sql/tc/schema.sql share/txc/sql/rm/001_undo_log.sql \
  lib/systemd/system/tcd@.service lib/tmpfiles.d/txc.conf \
  share/man/man8/tcd.8 share/man/man1/tcctl.1 share/man/man5/tcd.ini.5 share/man/man1/txc-compensate.1 \
  share/man/man3/librmclient.3; do
  [[ -e $u/$f ]] || missing+=("$f")
done
compgen -G "$u/$libdir/librmclient.so*" >/dev/null || missing+=("$libdir/librmclient.so")
# the configuration's place for the prefix /usr is /etc (FHS), not /usr/etc
[[ -f $root/etc/txc/tcd.ini.example ]] || missing+=("/etc/txc/tcd.ini.example")
check "every file in its place under /usr${missing:+ (missing: ${missing[*]})}" test ${#missing[@]} -eq 0
for f in sbin/tcd bin/tcctl bin/txc-compensate bin/txc-db-migrate; do
  [[ -x $u/$f ]] || bad "$f is not executable"
done
strays=$(cd "$root" && find . -type f | grep -v '^./usr/' | grep -v '^./etc/txc/' || true)
check "nothing outside the prefix and /etc/txc${strays:+: $strays}" test -z "$strays"

# ---- 2. the installed programs run ----
check "installed tcd --version" bash -c "'$u/sbin/tcd' --version | grep -q ."
"$u/sbin/tcd" -c "$root/etc/txc/tcd.ini.example" --print-config >"$tmp/again.ini" 2>"$tmp/again.err" || true
check "tcd reads its example configuration back unchanged" cmp -s "$root/etc/txc/tcd.ini.example" "$tmp/again.ini"
check "installed tcctl --help" bash -c "'$u/bin/tcctl' --help | grep -q 'admin socket'"
db=txc_install_$$
psql -X -q -d "$TC_PG_URL" -c "CREATE DATABASE $db" >/dev/null
url=$(python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$TC_PG_URL" "$db")
if out=$("$u/bin/txc-db-migrate" "$url" tc 2>&1); then
  check "the installed txc-db-migrate applies the installed tc set" \
    test "$(psql -X -A -t -d "$url" -c "SELECT count(*) FROM pg_tables WHERE tablename IN ('global_table', 'branch_table', 'lock_table')")" = 3
else
  bad "the installed txc-db-migrate applies the installed tc set" "$out"
fi

# ---- 3. the man pages ----
for page in "$u"/share/man/man*/*; do
  warn=$(groff -man -ww -z "$page" 2>&1 || echo "groff failed")
  check "man page $(basename "$page") renders without a warning" test -z "$warn"
done
keys=$("$u/sbin/tcd" --print-config | sed -n 's/^\([a-z_]*\) = .*/\1/p' | sort -u)
documented() { grep -q "^\.B $1\( \|$\)" "$u/share/man/man5/tcd.ini.5"; }
check_every "tcd.ini(5) names every setting" keys "$keys" documented

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
