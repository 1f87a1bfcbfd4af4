#!/usr/bin/env bash
# Builds the measured guest for Veil shards: code only, the same files for
# every stage and replica of every route.
#
#   vmlinuz      Debian's cloud kernel
#   initrd.img   the whole userland: Debian minbase with systemd, veil-shard,
#                the guest units and the config-disk reader (and with --gpu the
#                NVIDIA open kernel module, NVML and the CUDA driver library),
#                packed reproducibly: sorted names, fixed owners and times, gzip -n
#   cmdline      the kernel command line (the same for every guest)
#   packages.txt every Debian package in the image, with its version
#
# The route, the peer policy, the stage and replica, and the guest's network
# address are not in the image: they come from a config disk
# (make-config-disk.sh), bound by HOST_DATA (`veil-shard serve --bind-config`),
# so one launch measurement serves every guest and a route change needs no
# new measurement. With OVMF built with SNP kernel hashes (build-ovmf.sh), the
# measurement covers the three files:
#   veil measure --ovmf OVMF.fd --kernel vmlinuz --initrd initrd.img \
#       --append "$(cat cmdline)" --vcpus N --vcpu-type T
set -euo pipefail

usage() {
  cat <<'EOF'
usage: build-image.sh --shard BIN --out DIR [--gpu [--cuda-libs DIR]] [--mirror URL] [--suite SUITE]
       build-image.sh --pack-only DIR OUT.img
       build-image.sh --help

Builds the guest (vmlinuz, initrd.img, cmdline, packages.txt) into DIR.
Runs as root on Debian with debootstrap and cpio.

  --shard BIN    veil-shard, built with `--features veil-enclave/hw` (and `cuda`
                 for a GPU image)
  --out DIR      where the four files go
  --gpu          add the GPU stack from Debian's non-free archive: the NVIDIA
                 open kernel module 550 (built by DKMS for the image's kernel),
                 nvidia-smi, NVML, libcuda and CUDA 12.4's cuBLAS, cuRAND, NVRTC
                 and runtime; veil-gpu.service sets the confidential-computing
                 ready state at boot. The shard must be a `cuda` build made with
                 VEIL_CUDA_VERSION=12.4 scripts/cuda-toolchain.sh (driver 550
                 cannot load a CUDA 13 build's kernels; its libraries would be
                 missing, and the build refuses a shard whose libraries are not
                 all in the image)
  --cuda-libs DIR  with --gpu: other CUDA user libraries (under their sonames),
                 installed in /usr/local/lib/veil/cuda ahead of Debian's
  --mirror URL   Debian archive (default: the pinned snapshot
                 http://snapshot.debian.org/archive/debian/$SNAPSHOT/;
                 any other mirror is not pinned: compare packages.txt)
  --suite S      Debian suite (default trixie)
  --pack-only    only the reproducible packing of DIR into OUT.img

Environment: SNAPSHOT (default 20251201T000000Z), SOURCE_DATE_EPOCH (every
file's time in the initrd), KERNEL_PKG (default linux-image-cloud-amd64).
EOF
}

SNAPSHOT="${SNAPSHOT:-20251201T000000Z}"   # snapshot.debian.org timestamp: pins every package
KERNEL_PKG="${KERNEL_PKG:-linux-image-cloud-amd64}"
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1735689600}"
export SOURCE_DATE_EPOCH
here="$(cd "$(dirname "$0")" && pwd)"

# Packs DIR into a newc cpio, gzip'd, identical for identical trees.
pack() {
  local dir="$1" out="$2"
  (
    cd "$dir"
    find . -mindepth 1 -print0 | LC_ALL=C sort -z |
      cpio --null --create --format=newc --owner=0:0 --reproducible --quiet
  ) | gzip -6 -n > "$out"
}

normalize_times() {
  find "$1" -mindepth 1 -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --pack-only)
    [ $# -eq 3 ] || { usage >&2; exit 2; }
    normalize_times "$2"
    pack "$2" "$3"
    sha256sum "$3"
    exit 0 ;;
esac

shard="" out="" gpu=0 mirror="" suite="trixie" cuda_libs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --shard) shard="${2:?--shard needs a file}"; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --gpu) gpu=1; shift ;;
    --cuda-libs) cuda_libs="${2:?--cuda-libs needs a directory}"; shift 2 ;;
    --mirror) mirror="${2:?--mirror needs a URL}"; shift 2 ;;
    --suite) suite="${2:?--suite needs a name}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$shard" ] && [ -n "$out" ] || { usage >&2; exit 2; }
[ -z "$cuda_libs" ] || [ "$gpu" = 1 ] || { echo "build-image.sh: --cuda-libs needs --gpu" >&2; exit 2; }
[ -x "$shard" ] || { echo "build-image.sh: $shard is not an executable" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "build-image.sh: debootstrap needs root" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "build-image.sh: install debootstrap (apt-get install debootstrap)" >&2; exit 2; }
mirror="${mirror:-http://snapshot.debian.org/archive/debian/$SNAPSHOT/}"

mkdir -p "$out"
root="$(mktemp -d)"
trap 'rm -rf --one-file-system "$root"' EXIT
include="systemd-sysv,udev,iproute2,$KERNEL_PKG"
components="main"
if [ "$gpu" = 1 ]; then
  include="$include,linux-headers-cloud-amd64"
  components="main,contrib,non-free,non-free-firmware"
fi
debootstrap --variant=minbase --components="$components" --include="$include" "$suite" "$root" "$mirror" || {
  cp "$root/debootstrap/debootstrap.log" "$out/debootstrap.log" 2>/dev/null &&
    echo "build-image.sh: debootstrap failed; its log: $out/debootstrap.log" >&2
  exit 1
}
if [ "$gpu" = 1 ]; then
  # Debian's open kernel module (Hopper confidential computing needs the open
  # module, 535 or later), NVML, libcuda, nvidia-smi, the persistence daemon,
  # and the CUDA 12.4 user libraries the `cuda` build links (built with
  # VEIL_CUDA_VERSION=12.4 scripts/cuda-toolchain.sh: driver 550 loads PTX up to 12.4).
  gpu_packages=(nvidia-open-kernel-dkms nvidia-open-kernel-support firmware-nvidia-gsp nvidia-smi libnvidia-ml1
    libcuda1 nvidia-persistenced libcudart12 libcublas12 libcublaslt12 libcurand10 libnvrtc12)
  # Packages configure in the chroot with /proc and /dev, and start no daemons.
  printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
  chmod 0755 "$root/usr/sbin/policy-rc.d"
  mount -t proc proc "$root/proc"
  mount --bind /dev "$root/dev"
  # (--one-file-system: never into the host's /dev, should an unmount fail)
  unmount() { for m in dev proc; do umount "$root/$m" 2>/dev/null || umount -l "$root/$m" 2>/dev/null || true; done; }
  trap 'unmount; rm -rf --one-file-system "$root"' EXIT
  apt_in() { chroot "$root" env DEBIAN_FRONTEND=noninteractive "$@" >> "$out/gpu-packages.log" 2>&1; }
  : > "$out/gpu-packages.log"
  apt_in apt-get update -q || { echo "build-image.sh: apt-get update failed: $out/gpu-packages.log" >&2; exit 1; }
  if ! apt_in apt-get install -y -q --no-install-recommends "${gpu_packages[@]}"; then
    # Debian 13's driver 550.163.01 calls pci_resize_resource() with three
    # arguments; trixie's kernel 6.12.117 took a fourth (exclude_bars) from
    # a stable update, so the module does not compile (Debian's backport,
    # 550.163.01-4~bpo13+1, neither). Where the kernel's header has the
    # fourth argument, pass 0 (exclude no BAR: the call's old meaning) and
    # configure again; any other failure stays a failure.
    src="$(ls -d "$root"/usr/src/nvidia-current-open-550.* 2>/dev/null | head -1)"
    if [ -n "$src" ] && grep -A1 'pci_resize_resource(struct pci_dev \*dev, int i, int size,' \
        "$root"/usr/src/linux-headers-*-common/include/linux/pci.h | grep -q 'exclude_bars'; then
      echo "build-image.sh: patching the NVIDIA module for this kernel's pci_resize_resource (exclude_bars = 0)" >&2
      sed -i 's/pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size)/pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size, 0)/' \
        "$src/nvidia/nv-pci.c"
      apt_in dpkg --configure -a || true
    fi
    if ! chroot "$root" dpkg-query -W -f '${Status}\n' nvidia-open-kernel-dkms | grep -q "install ok installed"; then
      for log in "$root"/var/lib/dkms/*/*/build/make.log; do
        [ ! -f "$log" ] || cp "$log" "$out/dkms-make.log"
      done
      echo "build-image.sh: installing the GPU stack failed: $out/gpu-packages.log (and dkms-make.log)" >&2
      exit 1
    fi
  fi
  # DKMS built the modules for the image's kernel (Debian names them
  # nvidia-current-open*; its modprobe configuration answers `nvidia` with
  # them). The compilers are not needed at run time, but purging dkms also
  # removes nvidia-open-kernel-dkms, whose removal deletes the modules it
  # built: keep them aside, purge, and install them as plain modules.
  kver="$(basename "$(ls -d "$root"/lib/modules/* | head -1)")"
  built="$root/lib/modules/$kver/updates/dkms"
  ls "$built"/nvidia-current-open*.ko* >/dev/null 2>&1 ||
    { echo "build-image.sh: the NVIDIA module was not built for the image's kernel" >&2; exit 1; }
  aside="$(mktemp -d)"
  cp "$built"/nvidia-current-open*.ko* "$aside/"
  chroot "$root" apt-get purge -y -q --auto-remove linux-headers-cloud-amd64 dkms >/dev/null
  mkdir -p "$root/lib/modules/$kver/updates/nvidia"
  cp "$aside"/* "$root/lib/modules/$kver/updates/nvidia/"
  rm -rf "$aside"
  chroot "$root" depmod "$kver"
  # What the guest's modprobe will look up, resolved in the image.
  for m in nvidia-current-open nvidia-current-open-uvm; do
    chroot "$root" modinfo -k "$kver" -F filename "$m" >/dev/null 2>&1 ||
      { echo "build-image.sh: module $m is not in the image after removing the build tools" >&2; exit 1; }
  done
  unmount
  rm -f "$root/usr/sbin/policy-rc.d"
fi
chroot "$root" dpkg-query -W -f '${Package} ${Version}\n' | LC_ALL=C sort > "$out/packages.txt"

# The kernel goes outside (it is measured as the kernel); its modules stay inside.
cp "$root"/boot/vmlinuz-* "$out/vmlinuz"
rm -rf "$root"/boot "$root"/vmlinuz* "$root"/initrd.img* "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/locale "$root"/var/log/*.log \
  "$root"/var/cache/ldconfig/aux-cache   # inode numbers and times: differs between identical builds
rm -f "$root"/etc/machine-id && : > "$root"/etc/machine-id   # systemd fills it at boot, in RAM
echo veil-shard > "$root/etc/hostname"

install -m 0755 "$shard" "$root/usr/local/bin/veil-shard"
strip --strip-debug "$root/usr/local/bin/veil-shard" 2>/dev/null || true
if [ -n "$cuda_libs" ]; then
  install -d "$root/usr/local/lib/veil/cuda"
  cp -a "$cuda_libs"/*.so* "$root/usr/local/lib/veil/cuda/"
  echo /usr/local/lib/veil/cuda > "$root/etc/ld.so.conf.d/veil-cuda.conf"
  chroot "$root" ldconfig
fi
# Every library veil-shard links must be in the image (a `cuda` build without its libraries would fail at start).
if missing="$(chroot "$root" ldd /usr/local/bin/veil-shard | grep 'not found')"; then
  echo "build-image.sh: veil-shard needs libraries the image lacks:" >&2
  echo "$missing" >&2
  exit 1
fi
install -d -m 0755 "$root/usr/local/lib/veil" "$root/models" "$root/etc/systemd/journald.conf.d"
install -m 0755 "$here/guest/veil-guest-config" "$root/usr/local/lib/veil/veil-guest-config"
units=(veil-guest-config.service veil-shard.service)
[ "$gpu" = 1 ] && units+=(veil-gpu.service)
for u in "${units[@]}"; do
  install -m 0644 "$here/guest/$u" "$root/etc/systemd/system/$u"
done
install -m 0644 "$here/guest/journald-console.conf" "$root/etc/systemd/journald.conf.d/console.conf"
chroot "$root" systemctl enable systemd-networkd.service "${units[@]}" >/dev/null 2>&1
# No logins: the guest has no shell for anyone, the serial console only prints.
chroot "$root" systemctl mask serial-getty@ttyS0.service getty@tty1.service console-getty.service >/dev/null 2>&1
ln -sf /lib/systemd/systemd "$root/init"
normalize_times "$root"
pack "$root" "$out/initrd.img"
# Serial console; the initramfs is the root (no disk root, no swap).
echo "console=ttyS0 rdinit=/init panic=10 systemd.unit=multi-user.target systemd.show_status=error" > "$out/cmdline"
sha256sum "$out"/vmlinuz "$out"/initrd.img "$out"/cmdline
