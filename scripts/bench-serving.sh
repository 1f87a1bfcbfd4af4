#!/usr/bin/env bash
# Serving throughput against llama.cpp's own server, on the same model and
# machine, in one run: `llama-server --parallel 32` (continuous batching,
# built for this CPU: scripts/build-llama-server.sh) and a Veil route of
# three stages with sealing (deploy/local/cluster.toml's shape, simulated
# TEEs, release binaries) behind its relay. scripts/bench-serving.py drives
# both with the official openai client at 1, 8 and 32 closed-loop users and
# prints the table (aggregate tokens/s, time to first token p50/p99, the
# ratio). The servers are measured one at a time; the other sits idle
# (Veil's shards exchange heartbeats every 250 ms).
#
#   scripts/bench-serving.sh [--seconds S] [--users 1,8,32] [--max-tokens N] [--bin DIR]
# Needs PyPI (openai, maturin), a C/C++ compiler; a release build of Veil
# unless --bin. Ports: 127.0.0.1:7600-7682.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60; users="1,8,32"; max_tokens=64; bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --users) users="$2"; shift 2 ;;
    --max-tokens) max_tokens="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    *) echo "bench-serving.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
MODEL="$(scripts/fetch-model.sh)"
LLAMA_SERVER="$(scripts/build-llama-server.sh)"
if [ -z "$bin" ]; then
  cargo build --release --locked -p veil-host -p veil-enclave -p veil-client
  bin=target/release
fi
dir=target/bench-serving
rm -rf "$dir"; mkdir -p "$dir"
# The Python client, a release wheel, in a venv kept between runs.
venv=target/bench-serving-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check maturin openai
"$venv/bin/maturin" build --quiet --release --manifest-path client-sdk/python/Cargo.toml --out "$dir/wheels" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$dir"/wheels/veil_client-*.whl

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
up() { (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null; }

# Veil: the local route's shape on ports 7600.., its relay at 7680.
config="$dir/cluster.toml"
sed "s|\"\.\./\.\./target/|\"$PWD/target/|" deploy/local/cluster.toml > "$config"
for p in 7700 7701 7710 7720 7721 7730; do
  sed -i "s/127\.0\.0\.1:$p\"/127.0.0.1:$((p - 100))\"/" "$config"
done
"$bin/veil-host" cluster --config "$config" --model "$MODEL" --listen 127.0.0.1:7680 --run-dir "$dir/run" \
  > "$dir/cluster.out" 2> "$dir/cluster.log" &
pids+=("$!")
for _ in $(seq 1 240); do grep -qs "listening on" "$dir/cluster.out" && break; sleep 0.5; done
grep -qs "listening on" "$dir/cluster.out" || { echo "bench-serving.sh: the cluster did not come up" >&2; exit 1; }
# The relay the bench talks to: every user comes from 127.0.0.1 here, where
# a service's users have addresses of their own, so one address may hold
# every slot (--max-per-client 64; the cluster's own relay keeps 16).
"$bin/veil-host" relay --entry 127.0.0.1:7601 --listen 127.0.0.1:7682 --max-per-client 64 \
  > "$dir/relay.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 60); do up 127.0.0.1:7682 && break; sleep 0.5; done
"$bin/veil" policy init http://127.0.0.1:7682 --out "$dir/policy.toml" --allow-simulated --force > /dev/null

# llama.cpp: 32 slots of 1024 positions, every thread of the machine.
"$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port 7681 --parallel 32 -c 32768 --cont-batching \
  > "$dir/llama-server.log" 2>&1 &
pids+=("$!")
for _ in $(seq 1 120); do up 127.0.0.1:7681 && "$venv/bin/python" -c \
  "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7681/health')" 2>/dev/null && break; sleep 0.5; done

echo "bench-serving: Veil $("$bin/veil" --version 2>/dev/null || echo "($bin)"), llama-server from llama-cpp-python 0.3.36's llama.cpp (GGML_NATIVE), model $(basename "$MODEL"), $(nproc) cores"
"$venv/bin/python" scripts/bench-serving.py --veil http://127.0.0.1:7682 --policy "$dir/policy.toml" \
  --llama http://127.0.0.1:7681 --users "$users" --seconds "$seconds" --max-tokens "$max_tokens"
