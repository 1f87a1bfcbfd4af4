#!/usr/bin/env bash
# The soak: a local cluster (deploy/local/cluster.toml's route: the entry, two
# replicas of the middle stage, one of the last; simulated TEEs) supervised
# by `veil-host cluster`, a `veil-host relay` in front of it restarted by this
# script, and `veil-soak` (tests/src/bin/veil-soak.rs) sending an open-loop
# mix of streamed and non-streamed greedy chats through the relay. Once the
# reference answers are in, every --kill-every seconds one process is
# killed with SIGKILL: the entry, a stage replica, or the relay, in rounds
# that take each once in a random order; its supervisor starts it again. At the end: requests sent, completed and
# failed by reason, completed answers identical to the reference, time to
# first token and between tokens, the kills, and every process's resident
# memory over the run (target/soak/rss.csv, summed up per role), then
#   soak: S sent, C completed, F failed, I identical, p99 ttft T ms
# Exit 0 when every completed answer equals its reference, requests
# completed in the run's last quarter (the service recovered), and every
# process is up at the end; 1 otherwise.
#
#   scripts/soak.sh [--minutes M] [--kill-every SECS] [--rate R] [--seed S] [--bin DIR] [--dir DIR]
#     --minutes M        load for M minutes (default 60)
#     --kill-every SECS  one SIGKILL every SECS seconds (default 60; 0: none)
#     --rate R           requests per second, Poisson arrivals (default 0.5)
#     --bin DIR          run the binaries in DIR (e.g. target/debug, what the
#                        test command built) instead of a release build
#     --dir DIR          logs, the route and the report (default target/soak;
#                        emptied first)
# Ports: 127.0.0.1, VEIL_SOAK_PORTS (default 7800) plus 0, 1, 10, 20, 21, 30
# for the shards, 80 for the cluster's own API and 81 for the relay.
# Everything stays on loopback and ends with the script.
set -euo pipefail
# The whole script is one function, read before it runs: an hour-long run
# is not disturbed by an edit of this file meanwhile.
main() {
cd "$(dirname "$0")/.."
minutes=60; kill_every=60; rate=0.5; seed=1; bin=""; dir=target/soak
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --minutes) minutes="$2"; shift 2 ;;
    --kill-every) kill_every="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in minutes kill_every seed; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "soak.sh: --${v//_/-} must be a whole number" >&2; exit 2; }
done
[ "$minutes" -ge 1 ] || { echo "soak.sh: --minutes must be at least 1" >&2; exit 2; }
base="${VEIL_SOAK_PORTS:-7800}"
[[ "$base" =~ ^[0-9]+$ ]] && [ "$base" -ge 1024 ] && [ "$base" -le 65400 ] || { echo "soak.sh: bad VEIL_SOAK_PORTS" >&2; exit 2; }

MODEL="$(scripts/fetch-model.sh)"
if [ -z "$bin" ]; then
  cargo build --release --locked -p veil-host -p veil-enclave -p veil-client -p veil-tests --bins
  bin=target/release
fi
for b in veil veil-host veil-shard veil-soak; do
  [ -x "$bin/$b" ] || { echo "soak.sh: $bin has no $b (cargo build --bins)" >&2; exit 2; }
done

rm -rf "$dir"; mkdir -p "$dir"
config="$dir/cluster.toml"
# The route file's relative paths (the simulated root and its policy) made
# absolute, so the copy works from any directory.
sed "s|\"\.\./\.\./target/|\"$PWD/target/|" deploy/local/cluster.toml > "$config"
for p in 7700 7701 7710 7720 7721 7730; do
  sed -i "s/127\.0\.0\.1:$p\"/127.0.0.1:$((base + p - 7700))\"/" "$config"
done
gateway="127.0.0.1:$((base + 1))"
cluster_api="127.0.0.1:$((base + 80))"
relay_api="127.0.0.1:$((base + 81))"
route="$dir/run/route.toml"

pids=()
cleanup() {
  touch "$dir/stop"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  pkill -TERM -f "veil-host relay --entry $gateway --listen $relay_api" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT

"$bin/veil-host" cluster --config "$config" --model "$MODEL" --listen "$cluster_api" --run-dir "$dir/run" \
  > "$dir/cluster.out" 2> "$dir/cluster.log" &
cluster=$!
pids+=("$cluster")
for _ in $(seq 1 240); do
  grep -qs "listening on" "$dir/cluster.out" && break
  kill -0 "$cluster" 2>/dev/null || { cat "$dir/cluster.log" >&2; exit 1; }
  sleep 0.5
done
grep -qs "listening on" "$dir/cluster.out" || { echo "soak.sh: the cluster did not come up" >&2; exit 1; }

# The relay, as a host runs it: its own process, restarted when it dies.
# (The subshell's own stderr, where bash reports the SIGKILL, goes to the log.)
(
  while [ ! -e "$dir/stop" ]; do
    "$bin/veil-host" relay --entry "$gateway" --listen "$relay_api" >> "$dir/relay.log" 2>&1 || true
    sleep 0.5
  done
) 2>> "$dir/relay.log" &
pids+=("$!")
up() { (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null; }
for _ in $(seq 1 60); do up "$relay_api" && break; sleep 0.5; done
up "$relay_api" || { echo "soak.sh: the relay did not come up" >&2; cat "$dir/relay.log" >&2; exit 1; }

"$bin/veil" policy init "http://$relay_api" --out "$dir/policy.toml" --allow-simulated --force > /dev/null

# Which process plays each role now (empty while it restarts).
roles=(entry stage1-replica0 stage1-replica1 stage2 relay)
pid_of() {
  case "$1" in
    entry) pgrep -f -- "--config $route --stage 0 --replica 0 --supervised" | head -n 1 ;;
    stage1-replica0) pgrep -f -- "--config $route --stage 1 --replica 0 --supervised" | head -n 1 ;;
    stage1-replica1) pgrep -f -- "--config $route --stage 1 --replica 1 --supervised" | head -n 1 ;;
    stage2) pgrep -f -- "--config $route --stage 2 --replica 0 --supervised" | head -n 1 ;;
    relay) pgrep -f -- "veil-host relay --entry $gateway --listen $relay_api" | head -n 1 ;;
    supervisor) echo "$cluster" ;;
  esac
}

echo "soak: $minutes min at $rate requests/s, one SIGKILL every ${kill_every}s (0: none); logs in $dir/"
"$bin/veil-soak" --url "http://$relay_api" --policy "$dir/policy.toml" --seconds $((minutes * 60)) \
  --rate "$rate" --seed "$seed" --ready "$dir/ready" --report "$dir/report.json" > "$dir/soak.out" 2> "$dir/soak.log" &
soak=$!
pids+=("$soak")
tail -f "$dir/soak.out" --pid "$soak" &

# Resident memory of every role, every 10 s.
(
  echo "seconds,role,pid,rss_kib" > "$dir/rss.csv"
  t0=$(date +%s)
  while [ ! -e "$dir/stop" ]; do
    for r in supervisor "${roles[@]}"; do
      p="$(pid_of "$r" || true)"
      [ -n "$p" ] || continue
      kib="$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null || true)"
      [ -n "$kib" ] && echo "$(( $(date +%s) - t0 )),$r,$p,$kib" >> "$dir/rss.csv"
    done
    sleep 10
  done
) &
pids+=("$!")

# The faults, once the reference answers are in.
(
  [ "$kill_every" -gt 0 ] || exit 0
  while [ ! -e "$dir/ready" ]; do sleep 1; kill -0 "$soak" 2>/dev/null || exit 0; done
  RANDOM="$seed"
  order=()
  while kill -0 "$soak" 2>/dev/null && [ ! -e "$dir/stop" ]; do
    sleep "$kill_every"
    kill -0 "$soak" 2>/dev/null || break
    # Rounds of every role once, each round in a random order: any run of
    # five kills or more reaches the entry and the relay too.
    if [ "${#order[@]}" -eq 0 ]; then
      order=("${roles[@]}")
      for ((i = ${#order[@]} - 1; i > 0; i--)); do
        j=$((RANDOM % (i + 1))); tmp="${order[i]}"; order[i]="${order[j]}"; order[j]="$tmp"
      done
    fi
    r="${order[0]}"; order=("${order[@]:1}")
    p="$(pid_of "$r" || true)"
    if [ -n "$p" ]; then
      kill -KILL "$p" 2>/dev/null && echo "$(date +%s) kill -9 $r (pid $p)" >> "$dir/kills.log"
    else
      echo "$(date +%s) $r was not running (still restarting)" >> "$dir/kills.log"
    fi
  done
) &
pids+=("$!")

status=0
wait "$soak" || status=$?

# Every role must be serving again.
missing=()
for r in "${roles[@]}"; do
  for _ in $(seq 1 60); do [ -n "$(pid_of "$r" || true)" ] && break; sleep 0.5; done
  [ -n "$(pid_of "$r" || true)" ] || missing+=("$r")
done
touch "$dir/stop"

echo "soak: kills:"
if [ -s "$dir/kills.log" ]; then sed 's/^[0-9]* /  /' "$dir/kills.log"; else echo "  none"; fi
echo "soak: resident memory per role, MiB (a role's process changes when it is killed):"
python3 - "$dir/rss.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
by = {}
for r in rows:
    by.setdefault(r["role"], []).append((int(r["seconds"]), r["pid"], int(r["rss_kib"]) / 1024))
print(f"  {'role':<16} {'samples':>7} {'first':>7} {'max':>7} {'last':>7}  {'longest-lived process: first -> last':<30}")
for role, s in by.items():
    pids = {}
    for t, pid, mib in s:
        pids.setdefault(pid, []).append(mib)
    longest = max(pids.values(), key=len)
    print(f"  {role:<16} {len(s):>7} {s[0][2]:>7.1f} {max(m for _, _, m in s):>7.1f} {s[-1][2]:>7.1f}  "
          f"{longest[0]:.1f} -> {longest[-1]:.1f} over {len(longest)} samples")
PY
grep "^soak: .* sent, " "$dir/soak.out" | tail -n 1 > "$dir/summary.txt" || true
if [ "${#missing[@]}" -gt 0 ]; then
  echo "soak: FAIL: not running at the end: ${missing[*]}"
  status=1
fi
[ -s "$dir/summary.txt" ] && cat "$dir/summary.txt"
exit "$status"
}
main "$@"
