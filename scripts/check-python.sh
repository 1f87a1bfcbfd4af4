#!/usr/bin/env bash
# The Python package (client-sdk/python, `import veil`): builds the wheel
# with maturin (debug profile, in the workspace's target directory, so it
# reuses what cargo built), installs it with the official openai client and
# pytest into a fresh venv (target/python-venv), and runs its tests against a
# local three-stage cluster of the workspace's debug binaries; the chat page
# of `veil web` is tested in headless Chromium (selenium, Debian's chromium
# and chromium-driver; skipped where they are missing unless
# VEIL_REQUIRE_BROWSER=1), its screenshots left in target/browser-screenshots.
#
#   scripts/check-python.sh [--help] [PYTEST ARGS]
# Needs: `cargo build --workspace` (or `cargo test`) done, python3 with venv
# and pip, PyPI reachable; the model from VEIL_MODEL or scripts/fetch-model.sh.
# Where python3's venv or PyPI is missing it prints one SKIP line (recorded
# among the skipped checks) and exits 0, unless VEIL_REQUIRE_PYTHON=1.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
target="${CARGO_TARGET_DIR:-target}"
skip() {
  [ -z "${VEIL_REQUIRE_PYTHON:-}" ] || { echo "FAIL check-python: $* (VEIL_REQUIRE_PYTHON=1)" >&2; exit 1; }
  echo "SKIP check-python: $*"
  mkdir -p "$target/debug" && echo "check-python: $*" >> "$target/debug/veil-skipped.txt"
  exit 0
}
venv="$target/python-venv"
rm -rf "$venv" "$target/wheels"
python3 -m venv "$venv" >/dev/null 2>&1 || skip "python3 cannot make a venv (apt install python3-venv)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  maturin==1.16.0 pytest==9.2.0 openai==3.57.0 anyio==4.16.0 selenium==4.50.0 ||
  skip "PyPI unreachable (maturin, pytest, openai, selenium)"
"$venv/bin/maturin" build --manifest-path client-sdk/python/Cargo.toml --locked --out "$target/wheels" \
  --interpreter "$venv/bin/python" --target-dir "$target"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$target"/wheels/veil_client-*.whl
VEIL_MODEL="${VEIL_MODEL:-$(scripts/fetch-model.sh)}"
VEIL_BIN_DIR="$(cd "${VEIL_BIN_DIR:-$target/debug}" && pwd)"
export VEIL_MODEL VEIL_BIN_DIR
python="$(cd "$venv/bin" && pwd)/python"
# From the tests' directory, so `import veil` finds the installed wheel (the
# package source is one level up, not on the path).
cd client-sdk/python/tests
exec "$python" -m pytest -q -p no:cacheprovider . "$@"
