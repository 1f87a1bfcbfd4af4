#!/usr/bin/env bash
# Launches one Veil shard as an SEV-SNP guest with measured direct boot and,
# when GPU_BDF is set, an NVIDIA GPU in confidential-computing mode passed
# through. Every input that shapes the launch measurement is named here; the
# same values given to `veil measure` reproduce it.
set -euo pipefail

usage() {
  cat <<'EOF2'
usage: launch-snp.sh            (settings from the environment; systemd: veil-cvm@NAME reads /etc/veil/cvm/NAME.env)
       launch-snp.sh --print    print the QEMU command instead of running it
       launch-snp.sh --help

Measured (the same for every stage and replica):
  OVMF       firmware with SNP kernel hashes (build-ovmf.sh)
  KERNEL, INITRD, CMDLINE   from build-image.sh (CMDLINE: the cmdline file's content)
  VCPUS, VCPU_TYPE (default EPYC-v4)
Not measured:
  MEM        guest memory (default 64G)
  WEIGHTS    ext4 disk image with the GGUF, attached read-only (serial veil-weights)
  CONFIG     the config disk from make-config-disk.sh (serial veil-config)
  HOST_DATA  base64 printed by make-config-disk.sh: binds the config disk's
             route and peer policy (the shard refuses any other)
  GPU_BDF    e.g. 0000:41:00.0, bound to vfio-pci, CC mode on
  NET        QEMU -netdev options (default: a tap on bridge BRIDGE through qemu-ifup)
  TAP        tap device name (default veil-NAME, from the unit's instance or "veil0")
  MAC        the NIC's MAC address (default: QEMU's)
Testing without SEV-SNP (scripts/check-cvm-cluster.sh): VEIL_LAUNCH=emulated
boots the same KERNEL, INITRD and CMDLINE with the same disks and network under
KVM or TCG (ACCEL, CPU), without SNP, firmware or GPU: no launch measurement
exists then, and the shards must attest with a simulated root.
EOF2
}
print=0
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --print) print=1 ;;
  '') ;;
  *) echo "launch-snp.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
missing=()
for v in KERNEL INITRD CMDLINE VCPUS WEIGHTS CONFIG; do
  [ -n "${!v:-}" ] || missing+=("$v")
done
mode="${VEIL_LAUNCH:-snp}"
[ "$mode" = emulated ] || [ -n "${OVMF:-}" ] || missing+=(OVMF)
if [ ${#missing[@]} -gt 0 ]; then
  echo "launch-snp.sh: set ${missing[*]} (see --help)" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
VCPU_TYPE="${VCPU_TYPE:-EPYC-v4}"
MEM="${MEM:-64G}"
TAP="${TAP:-veil0}"
NET="${NET:-tap,id=net0,ifname=$TAP,script=$here/qemu-ifup,downscript=no}"
nic="virtio-net-pci,netdev=net0,romfile="
[ -z "${MAC:-}" ] || nic="$nic,mac=$MAC"
disks=(-drive "file=$WEIGHTS,if=none,id=weights,format=raw,readonly=on"
       -device "virtio-blk-pci,drive=weights,serial=veil-weights"
       -drive "file=$CONFIG,if=none,id=config,format=raw,readonly=on"
       -device "virtio-blk-pci,drive=config,serial=veil-config")
case "$mode" in
  snp)
    snp="sev-snp-guest,id=sev0,cbitpos=51,reduced-phys-bits=1,kernel-hashes=on"
    [ -z "${HOST_DATA:-}" ] || snp="$snp,host-data=$HOST_DATA"
    gpu=()
    if [ -n "${GPU_BDF:-}" ]; then
      # The GPU's BARs need a large 64-bit MMIO window; one root port per GPU.
      gpu=(-object iommufd,id=iommufd0
           -device pcie-root-port,id=rp0,bus=pcie.0,chassis=1
           -device vfio-pci,host="$GPU_BDF",bus=rp0,iommufd=iommufd0
           -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144)
    fi
    cmd=(qemu-system-x86_64
      -enable-kvm -nodefaults -nographic -serial stdio
      -machine q35,confidential-guest-support=sev0,memory-backend=ram0,vmport=off
      -object memory-backend-memfd,id=ram0,size="$MEM",share=true,prealloc=false
      -object "$snp"
      -cpu "$VCPU_TYPE" -smp "$VCPUS" -m "$MEM"
      -bios "$OVMF" -kernel "$KERNEL" -initrd "$INITRD" -append "$CMDLINE"
      "${disks[@]}"
      -netdev "$NET" -device "$nic"
      "${gpu[@]}")
    ;;
  emulated)
    cmd=(qemu-system-x86_64
      -accel "${ACCEL:-tcg}" -nodefaults -nographic -serial stdio -no-reboot
      -machine q35,vmport=off -cpu "${CPU:-max}" -smp "$VCPUS" -m "$MEM"
      -kernel "$KERNEL" -initrd "$INITRD" -append "$CMDLINE"
      "${disks[@]}"
      -netdev "$NET" -device "$nic")
    ;;
  *) echo "launch-snp.sh: VEIL_LAUNCH is snp or emulated, not $mode" >&2; exit 2 ;;
esac
if [ "$print" = 1 ]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
