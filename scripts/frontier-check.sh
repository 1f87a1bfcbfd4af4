#!/usr/bin/env bash
# Frontier shapes, end to end on one machine: gpt-oss-120b's and
# Qwen3-235B-A22B's exact metadata (dimensions, heads, experts, top-k,
# windows) with 4 of their layers of random weights load, split into 4
# stages (in-process, each stage its own slice and KV cache) and generate the
# same greedy tokens as the unsplit model; then `plan` states what 4 × H200
# would hold of the full model.
#
#   scripts/frontier-check.sh DIR [VOCAB_DIR]
#
# Needs a release build (cargo build --release -p veil-enclave --bin veil-shard),
# about 16 GB of free disk and 10 GB of memory. Exit status 0 when every check held.
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    "") usage >&2; exit 2 ;;
esac
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
vocab=${2:-${VEIL_LLAMACPP_REF:-$root/../shared/llamacpp-reference}/vocab}
shard=$root/target/release/veil-shard
[ -x "$shard" ] || { echo "build first: cargo build --release -p veil-enclave --bin veil-shard" >&2; exit 1; }
mkdir -p "$out"
failed=0
for spec in "gpt-oss-120b mxfp4 ggml-vocab-llama-bpe.gguf" "qwen3-235b-a22b q4_k ggml-vocab-qwen2.gguf"; do
    read -r shape dtype voc <<<"$spec"
    model=$out/$shape-4l-$dtype.gguf
    [ -f "$model" ] || "$shard" synth-model --shape "$shape" --layers 4 --dtype "$dtype" --sharpen 8 \
        --vocab "$vocab/$voc" --out "$model"
    # The manifest file, so that each stage proves the model root without hashing the others' tensors.
    [ -f "${model%.gguf}.veil-manifest.json" ] || "$shard" manifest "$model" --write >/dev/null
    start=$(date +%s)
    whole=$("$shard" generate --model "$model" --prompt "The capital of France is" --max-tokens 8 --json)
    split=$("$shard" generate --model "$model" --prompt "The capital of France is" --max-tokens 8 --json --split 1,2,3)
    ids() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["ids"])'; }
    a=$(ids <<<"$whole"); b=$(ids <<<"$split")
    echo "$shape ($dtype, 4 layers, $(du -h "$model" | cut -f1)): whole $a; 4 stages $b ($(( $(date +%s) - start )) s)"
    if [ "$a" != "$b" ] || [ "$a" = "[]" ]; then
        echo "  FAILED: the 4-stage split does not generate the whole model's tokens" >&2
        failed=1
    fi
    full=$(echo "$shape" | sed 's/-4l.*//')
    "$shard" plan --shape "$full" --dtype "$dtype" --stages 4 --gpu-mem 141G | sed 's/^/  /'
done
exit $failed
