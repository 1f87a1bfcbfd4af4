#!/usr/bin/env bash
# The test command: `cargo test --workspace --locked` (extra arguments are
# passed on), the clients' tests (scripts/build-wasm.sh builds the npm
# package of the WebAssembly client; scripts/check-python.sh builds the
# Python wheel and tests both against a local cluster), then the checks that did not
# run for lack of input, counted (the test harness hides a passing test's
# SKIP line; each is recorded in target/debug/veil-skipped.txt). It fails
# when either test suite fails.
#
#   scripts/test.sh [CARGO TEST ARGS]
# What the skipped checks need: docs/testing.md (the reference model from
# scripts/fetch-model.sh, real vectors at VEIL_VECTORS, llama.cpp's
# reference files at VEIL_LLAMACPP_REF, the openai and sev-snp-measure
# Python packages).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
skipped="${CARGO_TARGET_DIR:-target}/debug/veil-skipped.txt"
rm -f "$skipped"
cargo test --workspace --locked "$@"
status=$?
echo "== npm package of the WebAssembly client (scripts/build-wasm.sh)"
if ! scripts/build-wasm.sh; then
  if [ -n "${VEIL_REQUIRE_WASM:-}" ]; then
    echo "FAIL: scripts/build-wasm.sh (VEIL_REQUIRE_WASM=1)"
    status=1
  else
    echo "SKIP: the WebAssembly client did not build; its Node test will skip"
  fi
fi
echo "== Python package and the WebAssembly client in Node (scripts/check-python.sh)"
scripts/check-python.sh || status=1
if [ -s "$skipped" ]; then
  echo "== skipped checks (no input here; docs/testing.md says what each needs)"
  sort "$skipped" | uniq -c
else
  echo "== skipped checks: none"
fi
exit "$status"
