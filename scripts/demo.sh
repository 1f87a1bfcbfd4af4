#!/usr/bin/env bash
# The demo: fetch the model, build, start a 3-shard simulated-TEE cluster and
# its host, pin and verify the route, then chat sealed to the attested entry
# (interactive on a terminal; one scripted question otherwise). Stops the
# cluster on exit. Development only: the attestation is SIMULATED.
#
#   scripts/demo.sh [--help]
# Ports (all on 127.0.0.1): the host's public API on VEIL_DEMO_PORT (default
# 8080); the shards on VEIL_DEMO_SHARD_PORTS plus 0, 1, 10, 20, 21 and 30
# (default 7700, the ports of deploy/local/cluster.toml). The first build
# takes many minutes on a small machine (about 10 on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  '') ;;
  *) echo "demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
port="${VEIL_DEMO_PORT:-8080}"
base="${VEIL_DEMO_SHARD_PORTS:-7700}"
for p in "$port" "$base"; do
  [[ "$p" =~ ^[0-9]+$ ]] && [ "$p" -ge 1 ] && [ "$p" -le 65500 ] || { echo "demo.sh: bad port $p" >&2; exit 2; }
done

MODEL="$(scripts/fetch-model.sh)"
cargo build --release --locked
mkdir -p target/veil-local
URL="http://127.0.0.1:$port"
config=target/veil-local/cluster.toml
cp deploy/local/cluster.toml "$config"
for p in 7700 7701 7710 7720 7721 7730; do
  sed -i "s/127\.0\.0\.1:$p\"/127.0.0.1:$((base + p - 7700))\"/" "$config"
done

./target/release/veil-host cluster --config "$config" --model "$MODEL" --listen "127.0.0.1:$port" \
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
