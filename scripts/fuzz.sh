#!/usr/bin/env bash
# Runs every cargo-fuzz target for a while (default 60 s each). Not part of CI.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# Needs cargo-fuzz (`cargo install cargo-fuzz`). Only a stable toolchain exists
# on our machines, so nightly features are unlocked with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(snp_report snp_cert_table evidence_bundle ratls_extension claims policy link_frames gpu_spdm rim route_doc sealed_open openai_request link_state gguf_file response_format tdx_quote tdx_collateral azure_hcl)
fi
export RUSTC_BOOTSTRAP=1
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "== fuzzing $t for ${seconds}s"
  limits=(-rss_limit_mb=2048)
  # A response format past the entry's compile budget (2 s, 512 MiB) is a
  # finding: a schema the structural limits let through.
  [ "$t" = response_format ] && limits=(-rss_limit_mb=512 -timeout=2)
  cargo fuzz run "$t" "corpus/$t" -- -max_total_time="$seconds" "${limits[@]}"
done
