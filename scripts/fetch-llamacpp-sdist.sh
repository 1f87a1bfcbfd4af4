#!/usr/bin/env bash
# The llama-cpp-python source distribution on PyPI, which vendors llama.cpp:
# downloaded once into the cache, its SHA-256 checked on every use. Prints
# the archive's path. Idempotent. What scripts/fetch-llamacpp-vocabs.sh,
# scripts/fetch-quant-suite.sh and scripts/build-llama-server.sh unpack.
#
#   scripts/fetch-llamacpp-sdist.sh            the archive's path
#   scripts/fetch-llamacpp-sdist.sh --version  the version (the archive's top directory is llama_cpp_python-VERSION)
#   VEIL_CACHE=/somewhere scripts/fetch-llamacpp-sdist.sh
set -euo pipefail

VERSION="0.3.36"
URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$VERSION.tar.gz"
SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

case "${1:-}" in
  -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --version) echo "$VERSION"; exit 0 ;;
  '') ;;
  *) echo "fetch-llamacpp-sdist.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

dir="${VEIL_CACHE:-$HOME/.cache/veil}/sdist"
file="$dir/llama_cpp_python-$VERSION.tar.gz"
if ! { [ -f "$file" ] && echo "$SHA256  $file" | sha256sum --check --status; }; then
  mkdir -p "$dir"
  tmp="$(mktemp "$dir/.download.XXXXXX")"
  trap 'rm -f "$tmp"' EXIT
  curl -fsSL --retry 3 -o "$tmp" "$URL" ||
    { echo "fetch-llamacpp-sdist.sh: cannot download $URL" >&2; exit 1; }
  echo "$SHA256  $tmp" | sha256sum --check --status ||
    { echo "fetch-llamacpp-sdist.sh: the archive is not llama-cpp-python $VERSION's (SHA-256 differs)" >&2; exit 1; }
  chmod 644 "$tmp"
  mv "$tmp" "$file"
fi
echo "$file"
