#!/usr/bin/env bash
# Real weights in every ggml type: builds ggml's own quantiser (its base
# library, `ggml-quants.c` and `ggml.c`, from the llama.cpp that the
# llama-cpp-python source distribution on PyPI vendors, checksummed; no
# architecture flags, so its floating point is the same on every x86-64),
# then quantises the reference model's matrices into each type with it
# (`scripts/make-quant-suite.py`). Idempotent. Prints the directory that
# holds the files (tests/all/quant_suite.rs reads it from VEIL_QUANT_SUITE):
# OUT, or the model cache's `quant-suite` (3 GB).
#
#   scripts/fetch-quant-suite.sh MODEL.gguf [OUT]
#   VEIL_CACHE=/somewhere scripts/fetch-quant-suite.sh MODEL.gguf
#
# Needs a C and C++ compiler, python3 with numpy and gguf (`pip install
# gguf==0.19.0`); about 30 s to build and 2 minutes to quantise on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="$(scripts/fetch-llamacpp-sdist.sh --version)"

case "${1:-}" in
  -h|--help|'') sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; [ -n "${1:-}" ]; exit $? ;;
esac
model="$1"
[ -f "$model" ] || { echo "fetch-quant-suite.sh: no model at $model" >&2; exit 1; }

cache="${VEIL_CACHE:-$HOME/.cache/veil}"
lib_dir="$cache/ggml-quantizer/$VERSION"
lib="$lib_dir/libggml-base.so"
if [ ! -f "$lib_dir/.complete" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  sdist="$(scripts/fetch-llamacpp-sdist.sh)"
  tar -xzf "$sdist" -C "$tmp" --strip-components=3 \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/ggml/include" "llama_cpp_python-$VERSION/vendor/llama.cpp/ggml/src"
  src="$tmp/ggml/src"
  # What CMake's configure_file writes (the version is only printed).
  sed -e 's/@GGML_VERSION@/0.25.3/' -e 's/@GGML_BUILD_COMMIT@/llama-cpp-python-'"$VERSION"'/' \
    "$src/ggml-version.h.in" > "$src/ggml-version.h"
  # The sources and flags of ggml's `ggml-base` target (its CMake build,
  # Release): no -march, so no FMA contraction and the same bytes everywhere.
  defs=(-DGGML_BUILD -DGGML_SCHED_MAX_COPIES=4 -DGGML_SHARED -D_GNU_SOURCE -D_XOPEN_SOURCE=600
    -I"$src" -I"$tmp/ggml/include" -O3 -DNDEBUG -fPIC -w)
  objs=()
  for f in ggml.c ggml-alloc.c ggml-quants.c ggml.cpp ggml-backend.cpp ggml-backend-meta.cpp ggml-opt.cpp \
           ggml-threading.cpp gguf.cpp; do
    case "$f" in
      *.c) cc "${defs[@]}" -std=gnu11 -c "$src/$f" -o "$tmp/$f.o" & ;;
      *) c++ "${defs[@]}" -std=gnu++17 -c "$src/$f" -o "$tmp/$f.o" & ;;
    esac
    objs+=("$tmp/$f.o")
    # Two at a time: the machine has two cores.
    [ "$(jobs -r | wc -l)" -lt 2 ] || wait -n
  done
  wait
  for o in "${objs[@]}"; do [ -f "$o" ] || { echo "fetch-quant-suite.sh: $(basename "$o" .o) did not compile" >&2; exit 1; }; done
  mkdir -p "$lib_dir"
  c++ -shared -O3 -o "$lib" "${objs[@]}" -lm
  touch "$lib_dir/.complete"
fi

out="${2:-$cache/models/quant-suite}"
python3 scripts/make-quant-suite.py --ggml "$lib" --model "$model" --out "$out" >&2
echo "$out"
