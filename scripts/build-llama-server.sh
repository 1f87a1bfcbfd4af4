#!/usr/bin/env bash
# llama.cpp's own server, `llama-server`, built for this CPU from the
# llama.cpp that the llama-cpp-python source distribution on PyPI vendors
# (scripts/fetch-llamacpp-sdist.sh, checksummed), with
# GGML_NATIVE=ON: what a user who builds llama.cpp here gets. CMake comes
# from PyPI into a private venv. Idempotent per CPU (the cache is keyed by
# the CPU's instruction-set flags, so a cache carried to another machine
# is not mistaken for a native build there); prints the binary's path.
# About 10 minutes on 2 cores the first time. The speed reference of
# scripts/bench-serving.sh.
#
#   scripts/build-llama-server.sh
#   VEIL_CACHE=/somewhere scripts/build-llama-server.sh
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "build-llama-server.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

VERSION="$(scripts/fetch-llamacpp-sdist.sh --version)"
cache="${VEIL_CACHE:-$HOME/.cache/veil}"
# GGML_NATIVE builds for the CPU that compiles: a binary from another CPU is not native here.
cpu="$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)"
dir="$cache/llama-server/$VERSION-native-$cpu"
bin="$dir/llama-server"
if [ ! -f "$dir/.complete" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  sdist="$(scripts/fetch-llamacpp-sdist.sh)"
  tar -xzf "$sdist" -C "$tmp" "llama_cpp_python-$VERSION/vendor/llama.cpp"
  src="$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp"
  python3 -m venv "$tmp/venv" >&2
  "$tmp/venv/bin/pip" install --quiet --disable-pip-version-check "cmake==3.31.6" >&2
  "$tmp/venv/bin/cmake" -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
  "$tmp/venv/bin/cmake" --build "$tmp/build" --target llama-server -j 2 >&2
  mkdir -p "$dir"
  cp "$tmp/build/bin/llama-server" "$bin"
  touch "$dir/.complete"
fi
echo "$bin"
