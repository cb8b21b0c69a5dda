#!/usr/bin/env bash
# The Debian package as a user meets it: installed with apt into a clean
# Debian 12 root made from Debian's packages (mmdebstrap), nothing of the
# build tree in it. There `cairn --version` names the package's version, the
# unit, its user and its config are in place, a Python agent and a
# JavaScript agent (with Debian's nodejs, 18) run to their end with the
# installed SDKs, host-side Python and Node find them, and `dpkg -r`
# leaves only what the package says it keeps (/etc/cairn until purged,
# /var/lib/cairn). Prints the time from an empty folder to the first run and
# the installed size.
# usage: deb_test.sh CAIRN_DEB
set -euo pipefail
deb="$(realpath "$1")"
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing: apt-get install mmdebstrap" >&2; exit 1; }
# Installing a package into a Debian root needs root; as a normal user the test is skipped, and says so.
[ "$(id -u)" = 0 ] || { echo "deb_test.sh: skipped: installing the package into a root needs root" >&2; exit 77; }
work="$(mktemp -d /var/tmp/cairn-deb-test.XXXXXX)"
root="$work/root"
trap 'rm -rf "$work"' EXIT

t0=$(date +%s.%N)
# Debian 12 as apt needs it, from the host's own mirror (its sources).
sources=/etc/apt/sources.list.d/debian.sources
[ -f "$sources" ] || sources=/etc/apt/sources.list
mmdebstrap --quiet --variant=apt bookworm "$root" "$sources"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# Commands run in the root through bwrap rather than chroot: a chrooted
# process may not create the user namespaces cairn's own sandboxes need.
# The host's /proc, /dev and /sys are the root's.
in_root() {
  bwrap --bind "$root" / --dev-bind /dev /dev --bind /proc /proc --bind /sys /sys --clearenv \
    --setenv PATH /usr/sbin:/usr/bin:/sbin:/bin --setenv HOME /root --setenv LANG C.UTF-8 --chdir /root -- "$@"
}

cp "$deb" "$root/tmp/"
{ in_root apt-get update -qq && in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    python3 nodejs "/tmp/$(basename "$deb")"; } >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; exit 1; }

version="$(dpkg-deb -f "$deb" Version)"
in_root cairn --version | grep -qx "cairn $version"
for file in /usr/lib/systemd/system/cairn.service /usr/lib/sysusers.d/cairn.conf /etc/cairn/cairn.toml \
            /usr/include/cairn/cairn.hpp /usr/share/doc/cairn/README.md /usr/share/man/man1/cairn.1.gz \
            /usr/share/man/man1/cairn-serve.1.gz /usr/share/bash-completion/completions/cairn; do
  [ -f "$root$file" ] || { echo "the package did not install $file" >&2; exit 1; }
done
in_root getent passwd cairn >/dev/null || { echo "postinst made no cairn user" >&2; exit 1; }
in_root cairn --config /etc/cairn/cairn.toml serve --help >/dev/null
in_root python3 -c 'import cairn' || { echo "host-side Python does not find the installed SDK" >&2; exit 1; }
# Node's CommonJS resolver searches /usr/share/nodejs, where the package links
# the SDK; an ES module's bare import does not (see below).
in_root node -e 'import(require.resolve("cairn")).then((m) => process.exit(typeof m.main === "function" ? 0 : 1))' ||
  { echo "host-side Node does not find the installed SDK in /usr/share/nodejs" >&2; exit 1; }

# A real agent, with the installed files only, in a folder the sandbox's uid
# may enter (as the docs say; /root may not be).
mkdir -p "$root/srv/demo/agent"
chmod 755 "$root/srv/demo" "$root/srv/demo/agent"
cat >"$root/srv/demo/agent/count.py" <<'AGENT'
#!/usr/bin/env python3
import cairn

def workflow(ctx, input):
    total = 0
    for i in range(input["steps"]):
        total = ctx.step(f"add {i}", lambda i=i, t=total: t + i)
    return {"total": total}

cairn.main(workflow)
AGENT
cat >"$root/srv/demo/agent/count.mjs" <<'AGENT'
#!/usr/bin/env node
import { main } from "cairn";

main(async (ctx, input) => {
  let total = 0;
  for (let i = 0; i < input.steps; i++) total = await ctx.step(`add ${i}`, () => total + i);
  return { total };
});
AGENT
chmod 755 "$root/srv/demo/agent/count.py" "$root/srv/demo/agent/count.mjs"
# An ES module outside the sandbox finds the SDK as docs/typescript.md says:
# a link in a node_modules folder above it (ESM has no global folders). The
# sandbox does not see /srv/demo: an agent there is given its own copy.
mkdir -p "$root/srv/demo/node_modules"
ln -s /usr/share/nodejs/cairn "$root/srv/demo/node_modules/cairn"
cat >"$root/srv/demo/check.mjs" <<'CHECK'
import { main } from "cairn";
if (typeof main !== "function") process.exit(1);
CHECK
in_root node /srv/demo/check.mjs || { echo "an ES module does not import the SDK through node_modules/cairn" >&2; exit 1; }
sandbox=bwrap
# bwrap needs user namespaces and pivot_root, which a chroot may not give; then
# the package is still tested without a sandbox (sandboxing is tested in tests/runtime).
in_root cairn doctor >"$work/doctor.txt" 2>&1 || sandbox=none
out="$(in_root sh -c "cd /srv/demo && cairn run agent/count.py --sandbox $sandbox --id first --input '{\"steps\":4}' --json")" ||
  { echo "$out"; cat "$work/doctor.txt"; exit 1; } >&2
echo "$out" | grep -q '"status": "completed"'
echo "$out" | grep -q '"total": 6'
t1=$(date +%s.%N)
out="$(in_root sh -c "cd /srv/demo && cairn run agent/count.mjs --sandbox $sandbox --id js --input '{\"steps\":4}' --json")" ||
  { echo "$out"; cat "$work/doctor.txt"; exit 1; } >&2
echo "$out" | grep -q '"status": "completed"'
echo "$out" | grep -q '"total": 6'
# Without a sandbox (and so without cgroups: RLIMIT_AS bounds the agent), as
# on a machine where bwrap cannot run: Debian's Node 18 starts there too.
out="$(in_root sh -c "cd /srv/demo && cairn run agent/count.mjs --sandbox none --id js-none --input '{\"steps\":4}' --json")" ||
  { echo "$out"; exit 1; } >&2
echo "$out" | grep -q '"status": "completed"'

size_kib="$(in_root dpkg-query -W -f='${Installed-Size}' cairn)"
files="$(in_root dpkg -L cairn)"
in_root dpkg -r cairn >/dev/null
while read -r path; do
  [ -n "$path" ] && [ ! -d "$root$path" ] && [ -e "$root$path" ] && [ "$path" != /etc/cairn/cairn.toml ] &&
    { echo "dpkg -r left $path" >&2; exit 1; }
done <<<"$files"
[ -f "$root/etc/cairn/cairn.toml" ] || { echo "dpkg -r removed the conffile /etc/cairn/cairn.toml" >&2; exit 1; }
in_root dpkg --purge cairn >/dev/null
[ ! -e "$root/etc/cairn/cairn.toml" ] || { echo "dpkg --purge left /etc/cairn/cairn.toml" >&2; exit 1; }

printf 'deb_test: %s installed into a clean Debian 12 root; first run (sandbox %s) %.0f s after an empty folder; installed size %s KiB\n' \
  "$(basename "$deb")" "$sandbox" "$(python3 -c "print($t1 - $t0)")" "$size_kib"
