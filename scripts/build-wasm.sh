#!/usr/bin/env bash
# Builds the npm package of the WebAssembly client (client-sdk/wasm) into
# target/npm/veil-client: veil_wasm.wasm (release, wasm32-unknown-unknown),
# its JS bindings (wasm-bindgen --target web: ES modules for browsers and
# Node 18+), and the JS API (js/veil.js, veil.d.ts, package.json). Prints the
# package's directory.
#
#   scripts/build-wasm.sh [--help]
# Needs: the wasm32-unknown-unknown target (rustup target add), clang (ring's
# C for wasm32), and wasm-bindgen-cli of the version Cargo.lock pins for
# wasm-bindgen (cargo install wasm-bindgen-cli --version V; this script does
# it when it is missing, into ~/.cargo/bin, a few minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  '') ;;
  *) echo "build-wasm.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
target="${CARGO_TARGET_DIR:-target}"
# Every prerequisite first, so a missing one fails at once, not after minutes.
command -v clang >/dev/null || { echo "build-wasm.sh: clang is missing (apt install clang): ring compiles C for wasm32" >&2; exit 1; }
command -v rustup >/dev/null || { echo "build-wasm.sh: rustup is missing (the wasm32-unknown-unknown target comes from it)" >&2; exit 1; }
version="$(awk '/^name = "wasm-bindgen"$/ {getline; gsub(/[^0-9.]/, ""); print; exit}' Cargo.lock)"
[ -n "$version" ] || { echo "build-wasm.sh: wasm-bindgen is not in Cargo.lock" >&2; exit 1; }
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  echo "build-wasm.sh: adding the wasm32-unknown-unknown target" >&2
  rustup target add wasm32-unknown-unknown >&2
fi
if ! wasm-bindgen --version 2>/dev/null | grep -qx "wasm-bindgen $version"; then
  echo "build-wasm.sh: installing wasm-bindgen-cli $version into ~/.cargo/bin (a few minutes on 2 cores)" >&2
  cargo install --quiet wasm-bindgen-cli --version "$version" >&2
fi
echo "build-wasm.sh: building veil-wasm for wasm32 (release; a few minutes the first time)" >&2
cargo build --quiet --locked --release -p veil-wasm --target wasm32-unknown-unknown >&2
out="$target/npm/veil-client"
rm -rf "$out" && mkdir -p "$out"
wasm-bindgen --target web --out-dir "$out" "$target/wasm32-unknown-unknown/release/veil_wasm.wasm"
cp client-sdk/wasm/js/veil.js client-sdk/wasm/js/veil.d.ts client-sdk/wasm/js/package.json "$out/"
cd "$out" && pwd
