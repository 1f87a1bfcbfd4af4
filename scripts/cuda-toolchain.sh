#!/usr/bin/env bash
# Installs what building the `cuda` feature needs on a machine with no GPU and
# no CUDA toolkit: NVIDIA's PyPI wheels of nvcc, the CUDA headers and CCCL
# (CUDA 13.0, the version the GPU machines' driver 580 loads PTX from), in a
# virtual environment under the cache, plus link stubs for the driver and the
# libraries cudarc links (libcuda.so.1, libnvrtc.so.13, libcublas.so.13,
# libcublasLt.so.13, libcurand.so.10), which no wheel ships, and a link name
# for the wheel's libcudart.so.13. The stubs carry
# the real sonames, so a binary linked against them loads the real libraries
# on a GPU machine; every stub function fails (CUDA_ERROR_STUB_LIBRARY), so a
# binary that finds a stub at run time reports "no driver" instead of running.
#
# Prints the environment to build with:
#   eval "$(scripts/cuda-toolchain.sh)"
#   cargo build --release -p veil-enclave --features cuda
# Idempotent: a second run only prints the environment.
set -euo pipefail

NVCC=13.0.88
NVVM=13.0.88
CRT=13.0.88
RUNTIME=13.0.96
CCCL=13.0.85
# candle-kernels compiles for one compute capability: 90 = Hopper (H100, H200).
COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"

root="${VEIL_CUDA:-$HOME/.cache/veil/cuda-$NVCC}"
venv="$root/venv"
stamp="$root/.complete"
cu="$venv/lib/python3.11/site-packages/nvidia/cu13"

if [ ! -f "$stamp" ]; then
  echo "installing CUDA $NVCC build tools from PyPI into $root" >&2
  mkdir -p "$root"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "nvidia-cuda-nvcc==$NVCC" "nvidia-nvvm==$NVVM" "nvidia-cuda-crt==$CRT" \
    "nvidia-cuda-runtime==$RUNTIME" "nvidia-cuda-cccl==$CCCL" >&2
  cu="$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)"
  [ -x "$cu/bin/nvcc" ] || { echo "nvcc is missing from the wheel" >&2; exit 1; }
  # The wheels put nvvm beside bin/; nvcc looks for it from its own directory.
  [ -d "$cu/nvvm" ] || { echo "nvvm is missing from the wheel" >&2; exit 1; }

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
  make_stub nvrtc libnvrtc.so.13 nvrtc
  make_stub cublas libcublas.so.13 cublas
  make_stub cublasLt libcublasLt.so.13 cublaslt
  make_stub curand libcurand.so.10 curand
  # candle-kernels links the CUDA runtime, which the runtime wheel ships under its soname only.
  ln -sf ../libcudart.so.13 "$stubs/libcudart.so"
  touch "$stamp"
fi

cu="$(echo "$venv"/lib/python3*/site-packages/nvidia/cu13)"
cat <<EOF
export PATH="$cu/bin:\$PATH"
export CUDA_ROOT="$cu" CUDA_PATH="$cu" CUDA_HOME="$cu"
export CUDA_COMPUTE_CAP=$COMPUTE_CAP
export VEIL_CUDA_STUBS="$cu/lib/stubs"
EOF
