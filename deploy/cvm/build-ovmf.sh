#!/usr/bin/env bash
# Builds the guest firmware: OVMF's AmdSev package (OvmfPkg/AmdSev/AmdSevX64.dsc),
# the one that carries the SNP_KERNEL_HASHES section measured direct boot
# needs (Debian's ovmf package builds other OVMF variants only). The source is
# pinned: edk2 as Debian 13 ships it, the orig tarball of Debian's edk2
# 2025.02 package (with the submodules edk2 builds from) and Debian's patches
# (2025.02-8+deb13u1: security fixes, and BaseTools without the BrotliCompress
# tool whose submodule Debian leaves out), both checked against the SHA-256
# in Debian's signed Sources index. Prints the firmware's SHA-256:
# publish it next to the measurements it produces (`veil measure --ovmf`).
#
# The firmware's bytes depend on the compiler too: reviewers reproduce the
# measurement from the published firmware file, not from a rebuild.
set -euo pipefail

usage() {
  cat <<'EOF2'
usage: build-ovmf.sh --out OVMF.fd [--work DIR]
       build-ovmf.sh --help

Fetches edk2 2025.02 and Debian's patches for it (SHA-256 pinned below), builds
OvmfPkg/AmdSev/AmdSevX64.dsc (RELEASE, GCC5) and copies OVMF.fd to --out.
Needs: curl, xz, gcc, g++, make, nasm, iasl (acpica-tools), uuid-dev, python3.
On Debian: apt-get install build-essential nasm acpica-tools uuid-dev python3 curl xz-utils patch
EOF2
}
EDK2_VERSION=2025.02
EDK2_URL="http://deb.debian.org/debian/pool/main/e/edk2/edk2_${EDK2_VERSION}.orig.tar.xz"
EDK2_SHA256=b63b6053d6d89c74d9291f9e96fde1584be99e6fb9c169ba9511505129d6b049
DEBIAN_URL="http://deb.debian.org/debian/pool/main/e/edk2/edk2_${EDK2_VERSION}-8%2Bdeb13u1.debian.tar.xz"
DEBIAN_SHA256=e2a7f6fc58640818416a028d6d5e9dfc255697a7cdc60c14566c236df6bd9b08

out="" work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a file}"; shift 2 ;;
    --work) work="${2:?--work needs a directory}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-ovmf.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { usage >&2; exit 2; }
for t in curl xz gcc make nasm iasl python3 patch flock; do
  command -v "$t" >/dev/null || { echo "build-ovmf.sh: $t is missing (see --help)" >&2; exit 2; }
done
if [ -z "$work" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
else
  mkdir -p "$work" || { echo "build-ovmf.sh: cannot create --work $work" >&2; exit 2; }
fi
tarball="$work/edk2_${EDK2_VERSION}.orig.tar.xz"
[ -f "$tarball" ] || curl -fsSL -o "$tarball" "$EDK2_URL"
echo "$EDK2_SHA256  $tarball" | sha256sum -c --quiet - ||
  { echo "build-ovmf.sh: $tarball is not the pinned edk2 source" >&2; exit 1; }
patches="$work/edk2_${EDK2_VERSION}-8+deb13u1.debian.tar.xz"
[ -f "$patches" ] || curl -fsSL -o "$patches" "$DEBIAN_URL"
echo "$DEBIAN_SHA256  $patches" | sha256sum -c --quiet - ||
  { echo "build-ovmf.sh: $patches is not the pinned Debian patch set" >&2; exit 1; }
rm -rf "$work/edk2" && mkdir -p "$work/edk2"
tar -xf "$tarball" -C "$work/edk2" --strip-components=1
tar -xf "$patches" -C "$work/edk2"
# The build tree's path reaches the firmware's bytes: GenFw gives every
# module a debug entry sized by the length of its ELF file's absolute path
# (the path itself is zeroed), so two builds at different paths differ. The
# build therefore runs under one fixed path, a link to the work tree, whatever
# --work is (edksetup.sh takes WORKSPACE from the logical $PWD). One build at
# a time holds the link.
fixed=/tmp/veil-ovmf-edk2
exec 9>"$fixed.lock"
flock 9
ln -sfn "$work/edk2" "$fixed"
cd "$fixed"
while read -r p; do
  case "$p" in ''|'#'*) continue ;; esac
  patch -s -p1 < "debian/patches/$p"
done < debian/patches/series
# The AmdSev package embeds a GRUB for its (unused here) disk-encryption boot
# path; measured direct boot never runs it, so an empty file stands in, as AMD's
# own SNP build scripts do.
: > OvmfPkg/AmdSev/Grub/grub.efi
make -s -C BaseTools -j"$(nproc)" >/dev/null
set +u
# shellcheck disable=SC1091
. ./edksetup.sh >/dev/null
set -u
build -q -n "$(nproc)" -a X64 -t GCC5 -b RELEASE -p OvmfPkg/AmdSev/AmdSevX64.dsc
install -m 0644 Build/AmdSev/RELEASE_GCC5/FV/OVMF.fd "$out"
sha256sum "$out"
