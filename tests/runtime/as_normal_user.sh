#!/usr/bin/env bash
# Runs a test binary as a normal user (uid and gid 65534, Debian's nobody),
# so that CI, which runs as root, also exercises cairn as most people run it:
# sandboxes without root, their isolation and escape cases, the warm pool's
# swap of a plain folder. This machine's cgroup v1 gives a normal user no
# totals (the v2 virtual machine test gives it a delegated subtree and checks
# them); a workspace quota needs /dev/fuse open to that user. What the user
# cannot have is named in CAIRN_TEST_WITHOUT, so the cases that need it say
# "NOT TESTED" and every other case runs.
# usage: as_normal_user.sh PROGRAM [ARG...]   (exit 77: could not run, says why)
set -euo pipefail
program=${1:?usage: as_normal_user.sh PROGRAM [ARG...]}
shift
skip() {
  echo "as_normal_user: NOT RUN: $*" >&2
  exit 77
}
[ "$(id -u)" = 0 ] || skip "this process is a normal user already: the same cases ran as it, without this wrapper"
command -v setpriv >/dev/null || { echo "as_normal_user: setpriv not found: apt-get install util-linux" >&2; exit 1; }
as_user() { setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp TMPDIR=/tmp "$@"; }
as_user test -x "$program" ||
  skip "uid 65534 cannot reach $program (a folder above it is closed to other users); build in a folder every user may enter"
without=${CAIRN_TEST_WITHOUT:+$CAIRN_TEST_WITHOUT,}root,cgroups
if ! as_user test -r /dev/fuse -a -w /dev/fuse; then
  echo "as_normal_user: /dev/fuse is closed to uid 65534 here: the workspace quota's cases are not tested" >&2
  without=$without,quota
fi
as_user CAIRN_TEST_WITHOUT="$without" "$program" "$@"
