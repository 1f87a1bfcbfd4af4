#!/usr/bin/env bash
# The test command: `cargo test --workspace --locked` (extra arguments are
# passed on), the Python package's tests (scripts/check-python.sh: the wheel
# built and tested against a local cluster), then the checks that did not
# run for lack of input, counted (the test harness hides a passing test's
# SKIP line; each is recorded in target/debug/veil-skipped.txt). It fails
# when either test suite fails.
#
#   scripts/test.sh [CARGO TEST ARGS]
# What the skipped checks need: README, "Test" (the reference model from
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
echo "== Python package (scripts/check-python.sh)"
scripts/check-python.sh || status=1
if [ -s "$skipped" ]; then
  echo "== skipped checks (no input here; README, \"Test\", says what each needs)"
  sort "$skipped" | uniq -c
else
  echo "== skipped checks: none"
fi
exit "$status"
