#!/usr/bin/env bash
# Puts a Debian kernel and the few modules the cgroup v2 test's virtual
# machine needs (virtio, 9p for the host's root, loop and ext4 for quota
# images, fuse for a normal user's) into
# DIR, from Debian's own linux-image package; nothing is installed on the host.
# Safe to run repeatedly: a DIR that has them is left alone.
# usage: scripts/test-kernel.sh DIR
set -euo pipefail
dir=${1:?usage: test-kernel.sh DIR}
modules=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci netfs fscache 9pnet
         9pnet_virtio 9p loop crc16 mbcache jbd2 crc32c_generic ext4 fuse)
[ -f "$dir/vmlinuz" ] && [ "$(cat "$dir/modules.list" 2>/dev/null)" = "$(printf '%s\n' "${modules[@]}")" ] && exit 0

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
# linux-image-amd64 names the current kernel package of this release.
package() { apt-cache depends --important linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
name=$(package)
if [ -z "$name" ]; then
  $sudo apt-get update -qq
  name=$(package)
fi
[ -n "$name" ] || { echo "test-kernel: apt knows no linux-image-amd64 package (is a Debian mirror reachable?)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -qq -o APT::Sandbox::User=root "$name" >/dev/null) || {
  echo "test-kernel: could not download $name from the Debian mirror" >&2
  exit 1
}
dpkg-deb -x "$work"/*.deb "$work/root"
tree=$(echo "$work"/root/lib/modules/*/kernel)
mkdir -p "$dir.new"
cp "$work"/root/boot/vmlinuz-* "$dir.new/vmlinuz"
for m in "${modules[@]}"; do
  found=$(find "$tree" -name "$m.ko" -print -quit)
  [ -n "$found" ] || { echo "test-kernel: $name has no module $m.ko" >&2; exit 1; }
  cp "$found" "$dir.new/"
done
printf '%s\n' "${modules[@]}" > "$dir.new/modules.list"  # in load order
echo "$name" > "$dir.new/package"
rm -rf "$dir"
mv "$dir.new" "$dir"
echo "test-kernel: $name in $dir"
