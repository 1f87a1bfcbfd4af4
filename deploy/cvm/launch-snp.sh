#!/usr/bin/env bash
# Launches one Veil shard as an SEV-SNP guest with measured direct boot and,
# when GPU_BDF is set, an NVIDIA GPU in confidential-computing mode passed
# through. Every input that shapes the launch measurement is named here; the
# same values given to `veil measure` reproduce it.
#
#   OVMF      firmware with SNP kernel hashes (edk2 OvmfPkg/AmdSev/AmdSevX64.dsc)
#   KERNEL, INITRD, CMDLINE   from build-image.sh (CMDLINE: the file's content
#             plus " veil.stage=N veil.replica=N")
#   VCPUS, VCPU_TYPE (default EPYC-v4), MEM (default 64G)
#   WEIGHTS   the model file or disk image, attached read-only
#   GPU_BDF   e.g. 0000:41:00.0, already bound to vfio-pci, CC mode on
#   HOST_DATA optional: base64 of `veil-shard config-digest --base64`, when
#             the route and policy are bound through HOST_DATA instead of the image
#   NET       QEMU -netdev options (default: a tap device named veil0)
set -euo pipefail
: "${OVMF:?}" "${KERNEL:?}" "${INITRD:?}" "${CMDLINE:?}" "${VCPUS:?}" "${WEIGHTS:?}"
VCPU_TYPE="${VCPU_TYPE:-EPYC-v4}"
MEM="${MEM:-64G}"
NET="${NET:-tap,id=net0,ifname=veil0,script=no,downscript=no}"
snp="sev-snp-guest,id=sev0,cbitpos=51,reduced-phys-bits=1,kernel-hashes=on"
if [ -n "${HOST_DATA:-}" ]; then
  snp="$snp,host-data=$HOST_DATA"
fi
gpu=()
if [ -n "${GPU_BDF:-}" ]; then
  # The GPU's BARs need a large 64-bit MMIO window; one root port per GPU.
  gpu=(-object iommufd,id=iommufd0
       -device pcie-root-port,id=rp0,bus=pcie.0,chassis=1
       -device vfio-pci,host="$GPU_BDF",bus=rp0,iommufd=iommufd0
       -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=262144)
fi
exec qemu-system-x86_64 \
  -enable-kvm -nodefaults -nographic -serial stdio \
  -machine q35,confidential-guest-support=sev0,memory-backend=ram0,vmport=off \
  -object memory-backend-memfd,id=ram0,size="$MEM",share=true,prealloc=false \
  -object "$snp" \
  -cpu "$VCPU_TYPE" -smp "$VCPUS" -m "$MEM" \
  -bios "$OVMF" -kernel "$KERNEL" -initrd "$INITRD" -append "$CMDLINE" \
  -drive file="$WEIGHTS",if=virtio,format=raw,readonly=on \
  -netdev "$NET" -device virtio-net-pci,netdev=net0,romfile= \
  "${gpu[@]}"
