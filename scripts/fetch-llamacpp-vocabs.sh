#!/usr/bin/env bash
# Fetches every vocabulary test llama.cpp ships (`models/ggml-vocab-NAME.gguf`
# with its `.inp` strings and `.out` ids: BPE, sentencepiece and Gemma 4
# families, and the few vocabularies without tests) from the llama-cpp-python
# source distribution on PyPI, which vendors llama.cpp, checks the archive's
# SHA-256, and unpacks only those files into the cache. Idempotent. Prints the
# directory that holds `vocab/` (the vocabulary tests read it from
# VEIL_LLAMACPP_VOCABS).
#
#   scripts/fetch-llamacpp-vocabs.sh
#   VEIL_CACHE=/somewhere scripts/fetch-llamacpp-vocabs.sh
set -euo pipefail

VERSION="0.3.36"
URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$VERSION.tar.gz"
SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  '') ;;
  *) echo "fetch-llamacpp-vocabs.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

out="${VEIL_CACHE:-$HOME/.cache/veil}/llamacpp-vocabs/$VERSION"
if [ -f "$out/vocab/.complete" ]; then
  echo "$out"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --retry 3 -o "$tmp/sdist.tar.gz" "$URL" ||
  { echo "fetch-llamacpp-vocabs.sh: cannot download $URL" >&2; exit 1; }
echo "$SHA256  $tmp/sdist.tar.gz" | sha256sum --check --status ||
  { echo "fetch-llamacpp-vocabs.sh: the archive is not llama-cpp-python $VERSION's (SHA-256 differs)" >&2; exit 1; }
rm -rf "$out/vocab" && mkdir -p "$out/vocab"
tar -xzf "$tmp/sdist.tar.gz" -C "$out/vocab" --strip-components=4 --wildcards \
  "llama_cpp_python-$VERSION/vendor/llama.cpp/models/ggml-vocab-*"
n="$(find "$out/vocab" -name 'ggml-vocab-*.gguf.inp' | wc -l)"
[ "$n" -ge 10 ] || { echo "fetch-llamacpp-vocabs.sh: only $n vocabulary tests in the archive" >&2; exit 1; }
touch "$out/vocab/.complete"
echo "$out"
