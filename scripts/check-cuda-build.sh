#!/usr/bin/env bash
# The `cuda` build of veil-shard, checked where no GPU is: it compiles and
# links (against the link stubs of scripts/cuda-toolchain.sh), it starts with
# the driver libraries present only as stubs, `--device cuda:0` is one clear
# error ("cannot open CUDA device 0 … no NVIDIA driver"), and the device path's
# correctness checks pass on candle's CPU backend in that same binary.
#
#   eval "$(scripts/cuda-toolchain.sh)"; scripts/check-cuda-build.sh [MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${VEIL_CUDA_STUBS:?run eval \"\$(scripts/cuda-toolchain.sh)\" first}"
model="${1:-${VEIL_MODEL:-$(scripts/fetch-model.sh)}}"

cargo build --locked -p veil-enclave --features cuda --bin veil-shard
bin="${CARGO_TARGET_DIR:-target}/debug/veil-shard"
major="${VEIL_CUDA_MAJOR:-13}"   # the CUDA version scripts/cuda-toolchain.sh set up
echo "libraries the CUDA build loads:"
ldd "$bin" | grep -E "cuda|cublas|curand|nvrtc" | awk '{print "  " $1}'

# The libraries under their sonames, as a GPU-less machine with NVIDIA's stubs would have them.
rt="$(mktemp -d)"
trap 'rm -rf "$rt"' EXIT
cp "$VEIL_CUDA_STUBS/libcuda.so" "$rt/libcuda.so.1"
cp "$VEIL_CUDA_STUBS/libcublas.so" "$rt/libcublas.so.$major"
cp "$VEIL_CUDA_STUBS/libcublasLt.so" "$rt/libcublasLt.so.$major"
cp "$VEIL_CUDA_STUBS/libcurand.so" "$rt/libcurand.so.10"
cp "$VEIL_CUDA_STUBS/libnvrtc.so" "$rt/libnvrtc.so.$major"
cp -L "$VEIL_CUDA_STUBS/libcudart.so" "$rt/libcudart.so.$major"
export LD_LIBRARY_PATH="$rt"

"$bin" synth-model --shape smoke --out "$rt/smoke.gguf"
set +e
err="$("$bin" device-bench --model "$rt/smoke.gguf" --device cuda:0 2>&1 >/dev/null)"
code=$?
set -e
echo "--device cuda:0 with a stub driver: exit $code: $err"
if [ "$code" -eq 0 ] || ! grep -q "cannot open CUDA device 0" <<<"$err" || grep -q "panicked" <<<"$err"; then
  echo "FAIL: expected one clear error naming the device" >&2
  exit 1
fi
if [ "$(grep -c . <<<"$err")" -ne 1 ]; then
  echo "FAIL: the error is not one line" >&2
  exit 1
fi
"$bin" device-check --model "$model" --device candle-cpu 2>/dev/null
echo "cuda build: PASS"
