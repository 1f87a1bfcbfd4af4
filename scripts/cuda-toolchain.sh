#!/usr/bin/env bash
# Installs what building the `cuda` feature needs on a machine with no GPU and
# no CUDA toolkit: NVIDIA's PyPI wheels of nvcc, the CUDA headers and CCCL, in
# a virtual environment under the cache, plus link stubs for the driver and the
# libraries cudarc links (libcuda.so.1, libnvrtc, libcublas, libcublasLt,
# libcurand.so.10), which no wheel ships, and a link name for the wheel's
# libcudart. The stubs carry the real sonames, so a binary linked against them
# loads the real libraries on a GPU machine; every stub function fails
# (CUDA_ERROR_STUB_LIBRARY), so a binary that finds a stub at run time reports
# "no driver" instead of running.
#
# Two CUDA versions, chosen by VEIL_CUDA_VERSION:
#   13.0 (default)  from NVIDIA's PyPI wheels; needs driver >= 580 (the GPU
#                   machines of scripts/gpu-check.sh, the Kubernetes image)
#   12.4            from Debian 13's nvidia-cuda-toolkit packages (non-free,
#                   SHA-256 pinned below; about 1 GB; NVIDIA's 12.x wheels ship
#                   ptxas but no nvcc); needs driver >= 550: Debian 13's own
#                   driver, in the CVM guest image (deploy/cvm/build-image.sh
#                   --gpu installs Debian's CUDA 12.4 libraries beside it). A
#                   driver loads PTX of its own CUDA version or older only, so
#                   a 13.0 build cannot run there.
# Build each in its own target directory (cudarc and candle's kernels are
# compiled for the version found at build time).
#
# Prints the environment to build with:
#   eval "$(scripts/cuda-toolchain.sh)"
#   cargo build --release -p veil-enclave --features cuda
#   eval "$(VEIL_CUDA_VERSION=12.4 scripts/cuda-toolchain.sh)"
#   CARGO_TARGET_DIR=target/cuda12.4 cargo build --release -p veil-enclave --features hw,cuda
# Idempotent: a second run only prints the environment.
set -euo pipefail

case "${1:-}" in
  -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  '') ;;
  *) echo "cuda-toolchain.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
# CUDA 13.0, the default (deploy/k8s/cuda-libs.txt pins the same runtime and NVRTC).
NVCC=13.0.88
NVVM=13.0.88
CRT=13.0.88
RUNTIME=13.0.96
CCCL=13.0.85
version="${VEIL_CUDA_VERSION:-13.0}"
case "$version" in
  13.0)
    major=13
    wheels=("nvidia-cuda-nvcc==$NVCC" "nvidia-nvvm==$NVVM" "nvidia-cuda-crt==$CRT"
      "nvidia-cuda-runtime==$RUNTIME" "nvidia-cuda-cccl==$CCCL") ;;
  12.4)
    NVCC=12.4.131 major=12
    # Debian 13 (trixie): nvcc and the CUDA headers (non-free), CCCL's headers (main); path and SHA-256.
    debs=(
      "non-free/n/nvidia-cuda-toolkit/nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319"
      "non-free/n/nvidia-cuda-toolkit/nvidia-cuda-dev_12.4.127~12.4.1-2_amd64.deb d846838f914a0176948d48a8bcade5d6dbcccb5c9374343f6475f5503f173ee0"
      "non-free/n/nvidia-cuda-toolkit/libcudart12_12.4.127~12.4.1-2_amd64.deb 361b3721cf84bf068e111ff013c819de61cb475268b0d38db99839471f1b4130"
      "main/c/cccl/libcu++-dev_2.3.2-2_all.deb 30e911c1909265591b5ea793df0e49e56bed631238b68b3e75c97590c4985686"
      "main/c/cccl/libcub-dev_2.3.2-2_all.deb 4a7e7c24ef2994140e47dba59507db60e281f968f17c18cf1cadc9c27c17c26b"
      "main/c/cccl/libthrust-dev_2.3.2-2_all.deb 61fe44b65834efad9b079452ebec7396d4b37712d251421f4218b3bc652a3147"
    ) ;;
  *) echo "cuda-toolchain.sh: VEIL_CUDA_VERSION must be 13.0 or 12.4, not $version" >&2; exit 2 ;;
esac
# candle-kernels compiles for one compute capability: 90 = Hopper (H100, H200).
COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"

root="${VEIL_CUDA:-$HOME/.cache/veil/cuda-$NVCC}"
venv="$root/venv"
stamp="$root/.complete"
# One CUDA tree: the 13.x wheels share nvidia/cu13; Debian's 12.4 packages
# are unpacked and laid out as a toolkit in $root/cuda, with an nvcc.profile
# relative to nvcc's own path (Debian's points into /usr).
if [ "$major" = 13 ]; then cu="$venv/lib/python3.11/site-packages/nvidia/cu13"; else cu="$root/cuda"; fi

if [ ! -f "$stamp" ]; then
  echo "installing CUDA $NVCC build tools into $root" >&2
  mkdir -p "$root"
  if [ "$major" = 13 ]; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${wheels[@]}" >&2
    cu="$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)"
  else
    command -v dpkg-deb >/dev/null || { echo "dpkg-deb is needed to unpack Debian's CUDA packages" >&2; exit 1; }
    mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    mkdir -p "$root/debs" "$root/unpacked"
    for d in "${debs[@]}"; do
      read -r path sha <<<"$d"
      file="${path##*/}"
      if ! echo "$sha  $root/debs/$file" | sha256sum --check --status 2>/dev/null; then
        curl -fsSL -o "$root/debs/$file" "$mirror/pool/$path" >&2
        echo "$sha  $root/debs/$file" | sha256sum --check --status ||
          { echo "$file: SHA-256 differs from the pinned one" >&2; exit 1; }
      fi
      dpkg-deb -x "$root/debs/$file" "$root/unpacked"
    done
    u="$root/unpacked"
    rm -rf "$cu" && mkdir -p "$cu/bin" "$cu/nvvm" "$cu/lib"
    cp -a "$u/usr/lib/nvidia-cuda-toolkit/bin/nvcc" "$u/usr/lib/nvidia-cuda-toolkit/bin/cicc" \
      "$u/usr/lib/nvidia-cuda-toolkit/bin/crt" "$cu/bin/"
    for t in ptxas fatbinary nvlink cudafe++ bin2c nvprune cuobjdump; do
      [ ! -e "$u/usr/bin/$t" ] || cp -a "$u/usr/bin/$t" "$cu/bin/"
    done
    cp -a "$u/usr/lib/nvidia-cuda-toolkit/libdevice" "$cu/nvvm/libdevice"
    cp -a "$u/usr/include" "$cu/include"
    cp -a "$u"/usr/lib/x86_64-linux-gnu/libcudart.so.12* "$cu/lib/"
    cat > "$cu/bin/nvcc.profile" <<'PROFILE'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH            += $(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib/stubs" "-L$(TOP)/lib"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
PROFILE
    rm -rf "$root/unpacked"
    "$cu/bin/nvcc" --version | grep -q "release 12.4" || { echo "the unpacked nvcc does not run" >&2; exit 1; }
  fi
  [ -x "$cu/bin/nvcc" ] || { echo "nvcc is missing" >&2; exit 1; }
  # nvcc looks for nvvm from its own directory.
  [ -d "$cu/nvvm" ] || { echo "nvvm is missing" >&2; exit 1; }

  # Link stubs, generated from the symbol lists of the cudarc this workspace locks.
  # (On a fresh machine the registry is empty until `cargo fetch`: no match is not an error.)
  cudarc="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.* 2>/dev/null | sort -V | tail -1 || true)"
  if [ -z "$cudarc" ]; then
    (cd "$(dirname "$0")/.." && cargo fetch --locked >&2)
    cudarc="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.* | sort -V | tail -1)"
  fi
  stubs="$cu/lib/stubs"
  mkdir -p "$stubs"
  src="$(mktemp -d)"
  trap 'rm -rf "$src"' EXIT
  make_stub() { # name soname sys-module
    local name="$1" soname="$2" module="$3"
    {
      echo "/* Link stub for $soname: every function fails with CUDA_ERROR_STUB_LIBRARY (34). */"
      echo 'static const char MSG[] = "CUDA stub library: no NVIDIA driver is installed on this machine";'
      grep -oE '^pub unsafe fn [A-Za-z0-9_]+' "$cudarc/src/$module/sys/mod.rs" | awk '{print $4}' | sort -u |
        while read -r f; do
          case "$f" in
            cuGetErrorString|cuGetErrorName) echo "int $f(int e, const char **s) { (void)e; if (s) *s = MSG; return 0; }" ;;
            nvrtcGetErrorString) echo "const char *$f(int e) { (void)e; return MSG; }" ;;
            *) echo "int $f(void) { return 34; }" ;;
          esac
        done
    } >"$src/$name.c"
    gcc -shared -fPIC -O1 -w -Wl,-soname,"$soname" -o "$stubs/lib$name.so" "$src/$name.c"
  }
  make_stub cuda libcuda.so.1 driver
  make_stub nvrtc "libnvrtc.so.$major" nvrtc
  make_stub cublas "libcublas.so.$major" cublas
  make_stub cublasLt "libcublasLt.so.$major" cublaslt
  make_stub curand libcurand.so.10 curand
  # candle-kernels links the CUDA runtime, which the runtime wheel ships under its soname only.
  ln -sf "../libcudart.so.$major" "$stubs/libcudart.so"
  touch "$stamp"
fi

[ "$major" = 12 ] || cu="$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)"
cat <<EOF
export PATH="$cu/bin:\$PATH"
export CUDA_ROOT="$cu" CUDA_PATH="$cu" CUDA_HOME="$cu"
export CUDA_COMPUTE_CAP=$COMPUTE_CAP
export VEIL_CUDA_STUBS="$cu/lib/stubs" VEIL_CUDA_MAJOR=$major
EOF
