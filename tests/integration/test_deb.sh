#!/usr/bin/env bash
# test_deb.sh - the Debian packages of `make deb` (issue 27), made with
# CPack from this build: the three packages, what each holds and needs,
# and txc-server's maintainer scripts.  (Installing them with apt, and
# tcd from them answering tcctl nodes, is the acceptance run by hand on a
# Debian 12 machine: README "Install".)
#
# Needs TX_BUILD_DIR, set by ctest.
set -euo pipefail
build=${TX_BUILD_DIR:?TX_BUILD_DIR not set}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_deb.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   - $1"; }
bad() { failed=$((failed + 1)); echo "FAIL - $1"; [[ -z ${2:-} ]] || printf '%s\n' "$2" | sed 's/^/       /'; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

if ! out=$(cd "$tmp" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out" 2>&1); then
  bad "cpack" "$out"
  exit 1
fi
ok "cpack -G DEB"
deb() { compgen -G "$tmp/out/$1_*.deb" || compgen -G "$tmp/out/deb/$1_*.deb"; }
files() { dpkg-deb -c "$1" | awk '{print $6}'; }
for p in txc-server librmclient0 librmclient-dev; do
  check "package $p made" test -n "$(deb $p)"
done
s=$(deb txc-server) l=$(deb librmclient0) d=$(deb librmclient-dev)
[[ -n $s && -n $l && -n $d ]] || exit 1

check "txc-server: tcd, tcctl, the unit, tmpfiles, the tc schema, the example, man pages" bash -c "
  f=\$(dpkg-deb -c '$s' | awk '{print \$6}')
  for want in ./usr/sbin/tcd ./usr/bin/tcctl ./usr/lib/systemd/system/tcd@.service ./usr/lib/tmpfiles.d/txc.conf \
    ./usr/share/txc/sql/tc/001_store.sql ./etc/txc/tcd.ini.example ./usr/share/man/man8/tcd.8 \
    ./usr/share/man/man5/tcd.ini.5 ./usr/share/man/man1/tcctl.1; do
    grep -qx -- \"\$want\" <<<\"\$f\" || { echo \"missing \$want\"; exit 1; }
  done"
check "  its unit runs /usr/sbin/tcd on /etc/txc/<node>.ini" bash -c "
  dpkg-deb --fsys-tarfile '$s' | tar -xOf - ./usr/lib/systemd/system/tcd@.service |
    grep -qx 'ExecStart=/usr/sbin/tcd -c /etc/txc/%i.ini'"
check "  depends on librmclient0 (txc-db-migrate), adduser, and its libraries (shlibdeps)" bash -c "
  dep=\$(dpkg-deb -f '$s' Depends)
  for want in 'librmclient0 (= ' adduser libuv1 libpq5 libsodium23 libsystemd0; do
    grep -qF -- \"\$want\" <<<\"\$dep\" || { echo \"Depends lacks \$want: \$dep\"; exit 1; }
  done"
check "  postinst makes the txc user and /run/txc; /etc/txc/tcd.ini.example is a conffile" bash -c "
  dpkg-deb -e '$s' '$tmp/ctl' &&
  grep -q 'adduser --system' '$tmp/ctl/postinst' && grep -q 'systemd-tmpfiles --create' '$tmp/ctl/postinst' &&
  grep -qx /etc/txc/tcd.ini.example '$tmp/ctl/conffiles' && test -x '$tmp/ctl/postinst'"
check "librmclient0: the shared library, txc-db-migrate with the RM schema, txc-compensate; no header" bash -c "
  f=\$(dpkg-deb -c '$l' | awk '{print \$6}')
  for want in ./usr/bin/txc-db-migrate ./usr/bin/txc-compensate ./usr/share/txc/sql/rm/001_undo_log.sql; do
    grep -qx -- \"\$want\" <<<\"\$f\" || { echo \"missing \$want\"; exit 1; }
  done
  grep -q 'librmclient.so.0' <<<\"\$f\" && ! grep -q 'rm_client.h' <<<\"\$f\""
check "  depends on postgresql-client (txc-db-migrate runs psql)" bash -c "dpkg-deb -f '$l' Depends | grep -q postgresql-client"
check "librmclient-dev: header, .so link, .a, .pc, CMake files, librmclient(3); no shared object of its own" bash -c "
  f=\$(dpkg-deb -c '$d' | awk '{print \$6}')
  for want in ./usr/include/rm_client.h ./usr/share/man/man3/librmclient.3; do
    grep -qx -- \"\$want\" <<<\"\$f\" || { echo \"missing \$want\"; exit 1; }
  done
  grep -q 'librmclient.a\$' <<<\"\$f\" && grep -q 'pkgconfig/rmclient.pc\$' <<<\"\$f\" &&
  grep -q 'cmake/rmclient/rmclientConfig.cmake\$' <<<\"\$f\" && ! grep -q 'librmclient.so.0' <<<\"\$f\""
check "  depends on librmclient0 of the same version" bash -c "dpkg-deb -f '$d' Depends | grep -q 'librmclient0 (= '"
check "no file in two packages (they install side by side)" bash -c "
  dups=\$( { dpkg-deb -c '$s'; dpkg-deb -c '$l'; dpkg-deb -c '$d'; } | awk '\$1 !~ /^d/ {print \$6}' | sort | uniq -d)
  [ -z \"\$dups\" ] || { echo \"\$dups\"; exit 1; }"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
