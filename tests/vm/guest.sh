#!/bin/bash
# Runs inside the virtual machine of tests/vm/run.sh, as its init: the tests
# of the sandbox's totals on a kernel whose only hierarchy is cgroup v2, as
# root in the root cgroup, as root started inside a service's cgroup, and as
# a normal user given a delegated subtree. Ends by printing
# "cairn-vm: status N" and powering the machine off.
build=$1
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp TMPDIR=/tmp
# The detection test checks which kind it found.
export CAIRN_TEST_CGROUPS=v2
cg=/sys/fs/cgroup
status=0
echo "cairn-vm: begin ($(uname -r); cgroup v2 controllers: $(cat $cg/cgroup.controllers))"

# All of tests/runtime (the escape attempts, limits, warm pool, sweeps)
# but the walk of the whole tree, which over 9p under emulation outlasts its
# deadline; and the cases that go through the sandbox's cgroup: detection, one
# cgroup per sandbox, memory, processes and CPU totals, the sweep of a dead host's.
# Emulated, one test process keeps one of the two processors busy: root's
# cases and the normal user's run side by side (in cgroups of their own),
# but for the [serial] ones, which assert what a machine-wide sweep finds and
# run alone at the end.
detection="cgroups:*"
all_runtime='~"*a walk of the whole tree*"~[serial]~"cgroups:*"'
runtime_cases="cgroups:*,bwrap limits:*"
engine_cases="each limit of the policy*"
failed=/tmp/cairn-vm-failed
run() {
  echo "cairn-vm: $1"
  shift
  "$@" || { touch $failed; echo "cairn-vm: FAILED: $*"; }
}

# First alone, in a pristine hierarchy: cairn enables the controllers it needs.
run "as root, in the root cgroup (detection)" "$build/tests/runtime/runtime_test" --warn NoTests "$detection"

as_root() {
  run "as root, in the root cgroup" "$build/tests/runtime/runtime_test" --warn NoTests "$all_runtime"
  run "as root, in the root cgroup (engine)" "$build/tests/engine/engine_test" --warn NoTests "$engine_cases"
  run "as root, in the root cgroup, pooled sandboxes" \
    env CAIRN_TEST_SANDBOXES=pooled "$build/tests/runtime/runtime_test" --warn NoTests "bwrap limits:*"
  run "as root, in the root cgroup, agents started ahead" \
    env CAIRN_TEST_SANDBOXES=started "$build/tests/runtime/runtime_test" --warn NoTests "bwrap limits:*"

  # A service's cgroup, as systemd makes one: cairn is started inside it, so
  # that cgroup holds processes and cannot hand controllers down until cairn
  # moves them into a leaf of their own.
  mkdir -p $cg/system.slice/cairn.service
  echo "+memory +pids +cpu" > $cg/system.slice/cgroup.subtree_control
  run "as root, started inside a service's cgroup" \
    bash -c "echo \$\$ > $cg/system.slice/cairn.service/cgroup.procs && exec $build/tests/runtime/runtime_test --warn NoTests '$runtime_cases'"
  [ -d $cg/system.slice/cairn.service/cairn-host ] || { touch $failed; echo "cairn-vm: FAILED: no cairn-host leaf"; }
}

# A normal user's workspace quota is an image mounted through FUSE: Debian's
# udev lets every user open /dev/fuse.
chmod 0666 /dev/fuse
# A normal user's delegated subtree, as systemd's Delegate=yes makes one: the
# folder and its cgroup.procs, cgroup.threads and cgroup.subtree_control
# files belong to the user (the kernel's cgroup-v2.rst, "Delegation").
echo "+memory +pids +cpu" > $cg/cgroup.subtree_control
mkdir -p $cg/user.slice/delegated
echo "+memory +pids +cpu" > $cg/user.slice/cgroup.subtree_control
chown 65534:65534 $cg/user.slice/delegated
chown 65534:65534 $cg/user.slice/delegated/{cgroup.procs,cgroup.threads,cgroup.subtree_control}
# The user's shell: in the delegated cgroup, or in the leaf cairn moved it to.
user() {
  local at=$cg/user.slice/delegated
  [ -d $at/cairn-host ] && at=$at/cairn-host
  bash -c "echo \$\$ > $at/cgroup.procs && exec setpriv --reuid=65534 --regid=65534 --clear-groups env CAIRN_TEST_WITHOUT=root $*"
}
as_user() {
  run "as a normal user in a delegated subtree" user "$build/tests/runtime/runtime_test" --warn NoTests "'$detection'"
  run "as a normal user in a delegated subtree (all)" user "$build/tests/runtime/runtime_test" --warn NoTests "'$all_runtime'"
  run "as a normal user in a delegated subtree (engine)" user "$build/tests/engine/engine_test" --warn NoTests "'$engine_cases'"
  run "as a normal user in a delegated subtree, pooled sandboxes" \
    user CAIRN_TEST_WITHOUT=root,quota CAIRN_TEST_SANDBOXES=pooled "$build/tests/runtime/runtime_test" --warn NoTests "'bwrap limits:*'"
  run "as a normal user in a delegated subtree, agents started ahead" \
    user CAIRN_TEST_WITHOUT=root,quota CAIRN_TEST_SANDBOXES=started "$build/tests/runtime/runtime_test" --warn NoTests "'bwrap limits:*'"
  run "as a normal user in a delegated subtree, cairn workspace" \
    user "$build/tests/host/host_test" --warn NoTests "'cairn workspace*'"
  # Again, now that the first moved itself (and its shell) into cairn-host.
  run "as a normal user in a delegated subtree, a second process" user "$build/tests/runtime/runtime_test" --warn NoTests "'cgroups:*'"
}

start=$(date +%s)
as_root > /tmp/cairn-vm-root.log 2>&1 &
root_chain=$!
as_user > /tmp/cairn-vm-user.log 2>&1 &
user_chain=$!
wait $root_chain $user_chain
cat /tmp/cairn-vm-root.log /tmp/cairn-vm-user.log
echo "cairn-vm: side by side: $(( $(date +%s) - start )) s"
run "as root, alone: the sweeps" "$build/tests/runtime/runtime_test" --warn NoTests "[serial]"
run "as a normal user, alone: the sweeps" user "$build/tests/runtime/runtime_test" --warn NoTests "'[serial]'"

status=0
[ -e $failed ] && status=1
echo "cairn-vm: status $status"
echo o > /proc/sysrq-trigger
sleep 60
