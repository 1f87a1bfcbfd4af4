#!/usr/bin/env bash
# Writes the models of the large-model benchmarks (docs/PERFORMANCE.md, "Performance of
# the families") into DIR: random weights in real shapes, with real llama.cpp
# vocabularies, quantized by llama.cpp itself where llama.cpp has the mix.
#
#   scripts/bench-models.sh DIR [VOCAB_DIR]
#
# Then, for each file: VEIL_MODEL=DIR/FILE cargo bench -p veil-enclave --bench model
# and VEIL_SPLIT_MODEL=DIR/qwen3-30b-a3b-24l-q4_k-00001-of-00003.gguf cargo bench -p veil-enclave --bench stages
# Needs a release build (cargo build --release -p veil-enclave --bin veil-shard),
# pip install gguf llama-cpp-python==0.3.36, and about 30 GB of free disk
# (the f16 intermediates are deleted once quantized).
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
quantize=(python3 "$root/scripts/reference/quantize_llamacpp.py")
[ -x "$shard" ] || { echo "build first: cargo build --release -p veil-enclave --bin veil-shard" >&2; exit 1; }
[ -f "$vocab/ggml-vocab-llama-bpe.gguf" ] || { echo "no llama.cpp vocabularies in $vocab" >&2; exit 1; }
mkdir -p "$out"

# Dense, Llama-3.2-1B's shape (16 layers): Q8_0, Q4_K_M and Q6_K by llama.cpp.
if [ ! -f "$out/llama3.2-1b-q6_k.gguf" ]; then
    "$shard" synth-model --shape llama3.2-1b --dtype f16 --vocab "$vocab/ggml-vocab-llama-bpe.gguf" \
        --out "$out/llama3.2-1b-f16.gguf"
    for q in q8_0 q4_k_m q6_k; do
        "${quantize[@]}" "$out/llama3.2-1b-f16.gguf" "$out/llama3.2-1b-$q.gguf" "$q" 2>/dev/null
    done
    rm -f "$out/llama3.2-1b-f16.gguf"
fi

# A mixture of experts shaped like Qwen3-30B-A3B, 8 of its 48 layers, Q4_K_M by llama.cpp.
if [ ! -f "$out/qwen3-30b-a3b-8l-q4_k_m.gguf" ]; then
    "$shard" synth-model --shape qwen3-30b-a3b --layers 8 --dtype f16 --vocab "$vocab/ggml-vocab-qwen2.gguf" \
        --out "$out/qwen3-30b-a3b-8l-f16.gguf"
    "${quantize[@]}" "$out/qwen3-30b-a3b-8l-f16.gguf" "$out/qwen3-30b-a3b-8l-q4_k_m.gguf" q4_k_m 2>/dev/null
    rm -f "$out/qwen3-30b-a3b-8l-f16.gguf"
fi

# The same MoE shape with IQ2_XXS experts (random but valid blocks; llama.cpp writes IQ2_XXS only with an
# importance matrix), the other matrices Q8_0: what the dynamic quants of the largest MoE models ship.
if [ ! -f "$out/qwen3-30b-a3b-8l-iq2_xxs.gguf" ]; then
    "$shard" synth-model --shape qwen3-30b-a3b --layers 8 --dtype iq2_xxs --vocab "$vocab/ggml-vocab-qwen2.gguf" \
        --out "$out/qwen3-30b-a3b-8l-iq2_xxs.gguf"
fi

# gpt-oss-20b's shape, 4 of its 24 layers: experts MXFP4, the rest Q8_0, as its own GGUFs ship.
if [ ! -f "$out/gpt-oss-20b-4l-mxfp4.gguf" ]; then
    "$shard" synth-model --shape gpt-oss-20b --layers 4 --dtype mxfp4 --vocab "$vocab/ggml-vocab-llama-bpe.gguf" \
        --out "$out/gpt-oss-20b-4l-mxfp4.gguf"
fi
# A model larger than one small machine, for the stage-load bench: Qwen3-30B-A3B's shape,
# 24 layers, every matrix Q4_K, 8.6 GB in three files as gguf-split writes them.
if [ ! -f "$out/qwen3-30b-a3b-24l-q4_k-00001-of-00003.gguf" ]; then
    "$shard" synth-model --shape qwen3-30b-a3b --layers 24 --dtype q4_k --files 3 \
        --vocab "$vocab/ggml-vocab-qwen2.gguf" --out "$out/qwen3-30b-a3b-24l-q4_k-00001-of-00003.gguf"
fi
ls -l "$out"
