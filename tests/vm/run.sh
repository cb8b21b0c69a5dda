#!/usr/bin/env bash
# Boots a Debian kernel whose only cgroup hierarchy is v2 (the layout of
# Debian 12, Ubuntu 22.04+, Fedora and current Kubernetes nodes, which this
# test machine's cgroup v1 cannot show) in a qemu virtual machine, with this
# machine's root shared read-only over 9p, and runs tests/vm/guest.sh in it.
# Exits with the guest's status; without the kernel or qemu it fails, naming
# what to install.
# usage: tests/vm/run.sh KERNEL_DIR BUILD_DIR
set -euo pipefail
kernel=${1:?usage: run.sh KERNEL_DIR BUILD_DIR}
build=$(realpath "${2:?usage: run.sh KERNEL_DIR BUILD_DIR}")
here=$(realpath "$(dirname "$0")")
src=$(realpath "$here/../..")
fail() { echo "cgroup v2 vm: $*" >&2; exit 1; }
[ -f "$kernel/vmlinuz" ] || fail "no test kernel in $kernel: run 'scripts/test-kernel.sh $kernel' (make test does)"
for tool in qemu-system-x86_64 cpio; do
  command -v $tool >/dev/null || fail "$tool not found: run scripts/install-deps.sh (qemu-system-x86, cpio)"
done
# A static busybox is the initramfs: ldd refuses a static program.
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || fail "a static /bin/busybox is needed: apt-get install busybox-static"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The root is shared whole, and the source tree and the build (perhaps in a
# /tmp the guest covers with its own) once more each: tag=path.
shares="src=$src"
virtfs=(-virtfs "local,path=$src,mount_tag=src,security_model=none,readonly=on,multidevs=remap")
if [[ "$build/" != "$src/"* ]]; then
  shares="$shares build=$build"
  virtfs+=(-virtfs "local,path=$build,mount_tag=build,security_model=none,readonly=on,multidevs=remap")
fi
mkdir -p "$work/initrd/bin" "$work/initrd/lib"
cp /bin/busybox "$work/initrd/bin/"
while read -r m; do cp "$kernel/$m.ko" "$work/initrd/lib/"; done < "$kernel/modules.list"
cp "$kernel/modules.list" "$work/initrd/lib/"
cat > "$work/initrd/init" <<INIT
#!/bin/busybox sh
B=/bin/busybox
\$B mkdir -p /proc /sys /dev /newroot
\$B mount -t proc proc /proc
\$B mount -t devtmpfs dev /dev
while read m; do \$B insmod /lib/\$m.ko || echo "cgroup v2 vm: insmod \$m failed"; done < /lib/modules.list
\$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288 hostroot /newroot || { echo "cgroup v2 vm: no host root"; \$B poweroff -f; }
for d in tmp var/tmp var/cache run; do \$B mount -t tmpfs -o mode=1777 tmpfs /newroot/\$d; done
# The tree and the build again at their own paths, which may be under /tmp.
for share in $shares; do
  \$B mkdir -p "/newroot\${share#*=}"
  \$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288 "\${share%%=*}" "/newroot\${share#*=}" || { echo "cairn-vm: cannot mount \$share"; \$B poweroff -f; }
done
\$B mount --move /dev /newroot/dev
\$B mount --move /proc /newroot/proc
\$B mount -t sysfs sys /newroot/sys
\$B mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup
exec \$B switch_root /newroot /bin/bash "$here/guest.sh" "$build"
INIT
chmod +x "$work/initrd/init"
(cd "$work/initrd" && find . | cpio -o -H newc --quiet | gzip -1 > "$work/initrd.gz")

# Software emulation: nested KVM, where a machine has it, is not something a
# test can count on (this one has /dev/kvm and hangs in it).
status=0
timeout 2400 qemu-system-x86_64 -accel tcg -m 3072 -smp 2 -display none -monitor none -no-reboot \
  -serial "file:$work/console" -kernel "$kernel/vmlinuz" -initrd "$work/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap "${virtfs[@]}" || status=$?
result=$(tr -d '\r' < "$work/console" | sed -n 's/^cairn-vm: status \([0-9]*\)$/\1/p' | tail -1)
if [ -n "$result" ]; then
  tr -d '\r' < "$work/console" | sed -n '/^cairn-vm: begin/,$p'
else
  tr -d '\r' < "$work/console"
fi
[ $status -eq 0 ] || fail "qemu ended with status $status (124: the 40 min deadline)"
[ -n "$result" ] || fail "the guest ended without a status: its console is above"
exit "$result"
