#!/usr/bin/env bash
# The demo: fetch the model, build, start a 3-shard simulated-TEE cluster and
# its host, pin and verify the route, then ask one question sealed to the
# attested entry, greedily, and check that the answer names Paris (interactive
# chat follows on a terminal). Development only: the attestation is SIMULATED.
#
#   scripts/demo.sh [--keep] [--verbose] [--help]
#     --keep     leave the cluster serving when the demo ends, and print the
#                URL, the policy and the commands an app uses (stop it with
#                the kill command printed)
#     --verbose  print every shard's and the route's check tables (otherwise
#                one summary line, any warnings, and the file that holds them)
# Ports (all on 127.0.0.1): the host's public API on VEIL_DEMO_PORT (default
# 8080); the shards on VEIL_DEMO_SHARD_PORTS plus 0, 1, 10, 20, 21 and 30
# (default 7700, the ports of deploy/local/cluster.toml). The first build
# takes many minutes on a small machine (about 10 on 2 cores).
# VEIL_DEMO_BIN=DIR runs the binaries already in DIR instead of building
# (e.g. target/debug once the test command has built them).
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0; verbose=0
for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --keep) keep=1 ;;
    --verbose) verbose=1 ;;
    *) echo "demo.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
port="${VEIL_DEMO_PORT:-8080}"
base="${VEIL_DEMO_SHARD_PORTS:-7700}"
for p in "$port" "$base"; do
  [[ "$p" =~ ^[0-9]+$ ]] && [ "$p" -ge 1 ] && [ "$p" -le 65500 ] || { echo "demo.sh: bad port $p" >&2; exit 2; }
done

bin="${VEIL_DEMO_BIN:-./target/release}"

MODEL="$(scripts/fetch-model.sh)"
if [ -n "${VEIL_DEMO_BIN:-}" ]; then
  for b in veil veil-host veil-shard; do
    [ -x "$bin/$b" ] || { echo "demo.sh: VEIL_DEMO_BIN=$bin has no $b" >&2; exit 2; }
  done
else
  cargo build --release --locked
fi
mkdir -p target/veil-local
URL="http://127.0.0.1:$port"
config=target/veil-local/cluster.toml
policy=target/veil-local/policy.toml
cp deploy/local/cluster.toml "$config"
for p in 7700 7701 7710 7720 7721 7730; do
  sed -i "s/127\.0\.0\.1:$p\"/127.0.0.1:$((base + p - 7700))\"/" "$config"
done

"$bin/veil-host" cluster --config "$config" --model "$MODEL" --listen "127.0.0.1:$port" \
  > target/veil-local/cluster.out 2> target/veil-local/cluster.log &
cluster=$!
if [ "$keep" = 0 ]; then
  trap 'kill -TERM "$cluster" 2>/dev/null; wait "$cluster" 2>/dev/null || true' EXIT
fi

for _ in $(seq 1 240); do
  grep -q "listening on" target/veil-local/cluster.out && break
  kill -0 "$cluster" 2>/dev/null || { cat target/veil-local/cluster.log >&2; exit 1; }
  sleep 0.5
done
grep -q "listening on" target/veil-local/cluster.out || { echo "the cluster did not come up" >&2; exit 1; }

# Trust on first use: pin what the route presents (SIMULATED here), then verify against it.
"$bin/veil" policy init "$URL" --out "$policy" --allow-simulated --force
checks=target/veil-local/verify.txt
"$bin/veil" verify "$URL" --policy "$policy" > "$checks"
if [ "$verbose" = 1 ]; then
  cat "$checks"
else
  # Each distinct warning (every shard repeats the simulated ones), every
  # row that passed with a warning, then the verdict line.
  grep -E "^WARNING|[[:space:]]WARN([[:space:]]|\()" "$checks" | sed 's/^[[:space:]]*//' | sort -u || true
  tail -n 1 "$checks"
  echo "(every check table: $checks, or scripts/demo.sh --verbose)"
fi

# One question, greedily, with llama.cpp's chat default repetition penalty
# (1.1): the reference model's answer names Paris.
question="What is the capital of France? Answer in one sentence."
echo "> $question"
answer="$(echo "$question" | "$bin/veil" chat "$URL" --policy "$policy" \
  --temperature 0 --repeat-penalty 1.1 --max-tokens 48 2> target/veil-local/chat.log)" || {
  cat target/veil-local/chat.log >&2; echo "demo.sh: the chat failed" >&2; exit 1; }
echo "$answer"
if ! grep -qi "paris" <<< "$answer"; then
  echo "demo.sh: FAILED: the answer does not name Paris (chat log: target/veil-local/chat.log)" >&2
  exit 1
fi

if [ -t 0 ]; then
  "$bin/veil" chat "$URL" --policy "$policy"
fi

if [ "$keep" = 1 ]; then
  cat <<EOF

The cluster keeps serving (process $cluster; logs in target/veil-local/).
  URL:     $URL
  policy:  $policy   (pins this cluster's SIMULATED root; see docs/apps.md, "From Python")
  chat:    $bin/veil chat $URL --policy $policy
  OpenAI:  $bin/veil proxy $URL --policy $policy --listen 127.0.0.1:8000
           then any OpenAI client at http://127.0.0.1:8000/v1
  stop:    kill $cluster
EOF
fi
