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

case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  '') ;;
  *) echo "fetch-llamacpp-vocabs.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac

fetch_sdist="$(dirname "$0")/fetch-llamacpp-sdist.sh"
VERSION="$("$fetch_sdist" --version)"
out="${VEIL_CACHE:-$HOME/.cache/veil}/llamacpp-vocabs/$VERSION"
if [ -f "$out/vocab/.complete" ]; then
  echo "$out"
  exit 0
fi
sdist="$("$fetch_sdist")"
rm -rf "$out/vocab" && mkdir -p "$out/vocab"
tar -xzf "$sdist" -C "$out/vocab" --strip-components=4 --wildcards \
  "llama_cpp_python-$VERSION/vendor/llama.cpp/models/ggml-vocab-*"
n="$(find "$out/vocab" -name 'ggml-vocab-*.gguf.inp' | wc -l)"
[ "$n" -ge 10 ] || { echo "fetch-llamacpp-vocabs.sh: only $n vocabulary tests in the archive" >&2; exit 1; }
touch "$out/vocab/.complete"
echo "$out"
