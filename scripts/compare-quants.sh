#!/usr/bin/env bash
# Quality of Veil against llama.cpp on the same GGUFs, type by type: for each
# file, llama.cpp's perplexity (scripts/perplexity-llamacpp.py, which saves its
# log-probabilities) and Veil's (`veil-shard perplexity --kl-base` those), then
# a Markdown table: perplexity of both, their difference, the mean KL
# divergence of Veil's distributions from llama.cpp's, and top-1 agreement.
#
#   scripts/compare-quants.sh TEXT FILE.gguf...        (env: CTX=512 CHUNKS=4)
#
# Needs llama-cpp-python built for this CPU (CMAKE_ARGS="-DGGML_NATIVE=ON") and
# a built veil-shard (VEIL_SHARD, default target/release then target/debug).
# Files: scripts/make-real-quants.py makes the reference model in every type
# llama.cpp's quantizer writes without an importance matrix.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help|"") sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
text="$1"; shift
ctx="${CTX:-512}"; chunks="${CHUNKS:-4}"
shard="${VEIL_SHARD:-}"
if [ -z "$shard" ]; then
  for s in target/release/veil-shard target/debug/veil-shard; do [ -x "$s" ] && { shard="$s"; break; }; done
fi
[ -x "$shard" ] || { echo "no veil-shard built (cargo build --release -p veil-enclave)" >&2; exit 1; }
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
echo "| file | bytes/weight | perplexity, Veil | perplexity, llama.cpp | difference | KL(llama.cpp ‖ Veil) | top-1 agreement |"
echo "|---|---|---|---|---|---|---|"
for f in "$@"; do
  name="$(basename "$f" .gguf)"
  lc="$(python3 scripts/perplexity-llamacpp.py --model "$f" --file "$text" --ctx "$ctx" --chunks "$chunks" \
        --save-logits "$work/base.lgp" 2>/dev/null | sed -n 's/^perplexity: //p')"
  out="$("$shard" perplexity --model "$f" --file "$text" --ctx "$ctx" --chunks "$chunks" --kl-base "$work/base.lgp" 2>&1)" || {
    echo "| $name | | refused: $(echo "$out" | tail -1) | $lc | | | |"; continue; }
  veil="$(echo "$out" | sed -n 's/^perplexity: //p')"
  kl="$(echo "$out" | sed -n 's/^kl_divergence: //p')"
  top1="$(echo "$out" | sed -n 's/^top1_agreement: \([0-9.]*\).*/\1/p')"
  params="$(python3 -c "
import gguf,sys
r=gguf.GGUFReader(sys.argv[1]); n=sum(int(t.n_elements) for t in r.tensors); b=sum(int(t.n_bytes) for t in r.tensors)
print(f'{b/n:.3f}')" "$f")"
  diff="$(python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{100*(a-b)/b:+.2f}%')" "$veil" "$lc")"
  echo "| $name | $params | $veil | $lc | $diff | $kl | $top1 |"
done
