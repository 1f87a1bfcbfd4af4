#!/usr/bin/env bash
# The Python package (client-sdk/python, `import veil`): builds the wheel
# with maturin (debug profile, in the workspace's target directory, so it
# reuses what cargo built), installs it with the official openai client and
# pytest into a fresh venv (target/python-venv), and runs its tests against a
# local three-stage cluster of the workspace's debug binaries, then the
# openai-client tests again under the lowest openai the package allows
# (1.40.0, with httpx<0.28; it retries and wraps transport errors, which
# veil.openai() must undo), and puts the pinned openai back; the chat page
# of `veil web` is tested in headless Chromium (selenium, Debian's chromium
# and chromium-driver; skipped where they are missing unless
# VEIL_REQUIRE_BROWSER=1), its screenshots left in target/browser-screenshots.
#
#   scripts/check-python.sh [--help] [PYTEST ARGS]
# With PYTEST ARGS (a selection) the second openai run is left out.
# Needs: `cargo build --workspace` (or `cargo test`) done, python3 with venv
# and pip, PyPI reachable; the model from VEIL_MODEL or scripts/fetch-model.sh.
# Where python3's venv or PyPI is missing it prints one SKIP line (recorded
# among the skipped checks) and exits 0, unless VEIL_REQUIRE_PYTHON=1.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
target="${CARGO_TARGET_DIR:-target}"
skip() {
  [ -z "${VEIL_REQUIRE_PYTHON:-}" ] || { echo "FAIL check-python: $* (VEIL_REQUIRE_PYTHON=1)" >&2; exit 1; }
  echo "SKIP check-python: $*"
  mkdir -p "$target/debug" && echo "check-python: $*" >> "$target/debug/veil-skipped.txt"
  exit 0
}
venv="$target/python-venv"
openai_pinned=3.57.0 # the tests' openai; and the lowest pyproject.toml allows:
openai_lowest=1.40.0 # it retries and wraps transport errors, as 2.x does
rm -rf "$venv" "$target/wheels"
python3 -m venv "$venv" >/dev/null 2>&1 || skip "python3 cannot make a venv (apt install python3-venv)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  maturin==1.16.0 pytest==9.2.0 "openai==$openai_pinned" anyio==4.16.0 selenium==4.50.0 ||
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
status=0
"$python" -m pytest -q -p no:cacheprovider . "$@" || status=$?
[ "$#" -eq 0 ] || exit "$status"
# The tests that drive the official client again under the lowest openai,
# with the httpx it was released against (0.28 dropped the `proxies`
# argument it gives its default client); then the pinned openai back.
pip_quiet() { "$python" -m pip install --quiet --disable-pip-version-check "$@"; }
pip_quiet "openai==$openai_lowest" "httpx<0.28"
echo "== the openai-client tests under openai $openai_lowest"
"$python" -c "import openai; assert openai.__version__ == '$openai_lowest', openai.__version__" &&
  "$python" -m pytest -q -p no:cacheprovider test_openai_retries.py test_veil.py \
    -k "openai or every_client" || status=$?
pip_quiet "openai==$openai_pinned"
exit "$status"
