#!/usr/bin/env bash
# The demo: fetch the model, build, start a 3-shard simulated-TEE cluster and
# its host, pin and verify the route, then chat sealed to the attested entry
# (interactive on a terminal; one scripted question otherwise). Stops the
# cluster on exit. Development only: the attestation is SIMULATED.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="$(scripts/fetch-model.sh)"
cargo build --release --locked
mkdir -p target/veil-local
URL=http://127.0.0.1:8080

./target/release/veil-host cluster --config deploy/local/cluster.toml --model "$MODEL" --listen 127.0.0.1:8080 \
  > target/veil-local/cluster.out 2> target/veil-local/cluster.log &
cluster=$!
trap 'kill -TERM "$cluster" 2>/dev/null; wait "$cluster" 2>/dev/null || true' EXIT

for _ in $(seq 1 240); do
  grep -q "listening on" target/veil-local/cluster.out && break
  kill -0 "$cluster" 2>/dev/null || { cat target/veil-local/cluster.log >&2; exit 1; }
  sleep 0.5
done
grep -q "listening on" target/veil-local/cluster.out || { echo "the cluster did not come up" >&2; exit 1; }

# Trust on first use: pin what the route presents (SIMULATED here), then verify against it.
./target/release/veil policy init "$URL" --out target/veil-local/policy.toml --allow-simulated --force
./target/release/veil verify "$URL" --policy target/veil-local/policy.toml

if [ -t 0 ]; then
  ./target/release/veil chat "$URL" --policy target/veil-local/policy.toml
else
  echo "What is the capital of France?" | ./target/release/veil chat "$URL" --policy target/veil-local/policy.toml --max-tokens 48
fi
