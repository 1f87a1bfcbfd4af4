#!/usr/bin/env bash
# Builds the guest for one Veil shard as two files for measured direct boot:
#   vmlinuz     Debian's cloud kernel, from a pinned snapshot of the archive
#   initrd.img  the whole userland (Debian minbase from the same snapshot,
#               veil-shard, the route and peer policy, systemd units), packed
#               reproducibly: sorted names, fixed owners and times, gzip -n
# plus cmdline (the kernel command line). With OVMF built with SNP kernel
# hashes, the launch measurement covers all three, and so everything in the
# guest: `veil measure --ovmf OVMF.fd --kernel vmlinuz --initrd initrd.img
# --append "$(cat cmdline)" --vcpus N --vcpu-type T` reproduces it.
#
# Usage (root, on Debian with debootstrap):
#   deploy/cvm/build-image.sh --shard target/release/veil-shard \
#       --route route.toml --policy peer-policy.toml --out build/guest
#   deploy/cvm/build-image.sh --pack-only DIR OUT.img   # just the reproducible packing
set -euo pipefail

SNAPSHOT="${SNAPSHOT:-20251101T000000Z}"   # snapshot.debian.org timestamp: pins every package
SUITE="${SUITE:-trixie}"
KERNEL_PKG="${KERNEL_PKG:-linux-image-cloud-amd64}"
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1735689600}"  # every file's mtime in the initrd
export SOURCE_DATE_EPOCH

# Packs DIR into a newc cpio, gzip'd, identical for identical trees.
pack() {
  local dir="$1" out="$2"
  (
    cd "$dir"
    find . -mindepth 1 -print0 | LC_ALL=C sort -z |
      cpio --null --create --format=newc --owner=0:0 --reproducible --quiet
  ) | gzip -9 -n > "$out"
}

normalize_times() {
  find "$1" -mindepth 1 -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
}

if [ "${1:-}" = "--pack-only" ]; then
  normalize_times "$2"
  pack "$2" "$3"
  sha256sum "$3"
  exit 0
fi

shard="" route="" policy="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --shard) shard="$2"; shift 2 ;;
    --route) route="$2"; shift 2 ;;
    --policy) policy="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$shard" ] && [ -n "$route" ] && [ -n "$policy" ] && [ -n "$out" ] || {
  echo "usage: $0 --shard BIN --route ROUTE --policy POLICY --out DIR" >&2; exit 2; }

mkdir -p "$out"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mirror="http://snapshot.debian.org/archive/debian/$SNAPSHOT/"
debootstrap --variant=minbase --include=systemd-sysv,"$KERNEL_PKG",ca-certificates \
  "$SUITE" "$root" "$mirror"
# The kernel goes outside (it is measured as the kernel); modules stay inside.
cp "$root"/boot/vmlinuz-* "$out/vmlinuz"
rm -rf "$root"/boot "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
rm -f "$root"/etc/machine-id && : > "$root"/etc/machine-id   # systemd fills it at boot, in RAM
install -m 0755 "$shard" "$root/usr/local/bin/veil-shard"
install -d "$root/etc/veil"
install -m 0644 "$route" "$root/etc/veil/route.toml"
install -m 0644 "$policy" "$root/etc/veil/peer-policy.toml"
sed -i 's|^policy = .*|policy = "/etc/veil/peer-policy.toml"|' "$root/etc/veil/route.toml"
install -m 0644 "$(dirname "$0")/veil-shard.service" "$root/etc/systemd/system/veil-shard.service"
ln -sf /etc/systemd/system/veil-shard.service "$root/etc/systemd/system/multi-user.target.wants/veil-shard.service"
ln -sf /lib/systemd/systemd "$root/init"
normalize_times "$root"
pack "$root" "$out/initrd.img"
# Read-only weights on the second virtio disk; serial console; no swap.
echo "console=ttyS0 ro rdinit=/init systemd.unit=multi-user.target veil.weights=/dev/vdb" > "$out/cmdline"
sha256sum "$out"/vmlinuz "$out"/initrd.img "$out"/cmdline
