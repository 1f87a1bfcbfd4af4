#!/usr/bin/env bash
# Boots the CVM deployment of deploy/cvm here, without SEV-SNP: three guests
# built with the project's own recipe (build-image.sh), started by
# launch-snp.sh's emulated mode with the same kernel, initrd and command line
# an SNP launch measures, each with its weights disk and config disk, on taps
# of one bridge inside a network namespace this script creates (no packet
# leaves it). systemd in each guest starts its shard; the shards attest with a
# SIMULATED root that reports the launch measurement `veil measure` computes
# for these files and the HOST_DATA of their config. Then, from the namespace:
#  - `veil verify` through the relay accepts the route (measurement and
#    HOST_DATA pinned) and `veil chat` answers as one local process does;
#  - killing the serving stage-1 guest's QEMU mid-stream fails over to the
#    replica guest with identical output;
#  - the killed guest restarts and rejoins (it then serves alone);
#  - `veil measure` of exactly these files equals sev-snp-measure's value;
#  - three hostile config disks (the host writes them) are refused: a shell
#    command in guest.env by the guest, another route under the pinned
#    HOST_DATA by its shard, and that route under its own HOST_DATA by
#    `veil verify`.
#
#   sudo scripts/check-cvm-cluster.sh [--help]
# Binaries from VEIL_BIN_DIR (default target/debug: veil-shard, veil,
# veil-host, veil-test-fixtures); the model from VEIL_MODEL or
# scripts/fetch-model.sh. OVMF: an AmdSev build (build-ovmf.sh) for the
# measurement comparison; without one a fabricated firmware image with SNP
# kernel hashes stands in (it is said). Prints one SKIP line and exits 0 where
# QEMU cannot run (not root, no QEMU and no apt). VEIL_CVM_IMAGE_ARGS adds
# build-image.sh arguments (`--gpu`: the GPU image, with a `cuda` build of
# veil-shard made for CUDA 12.4; no GPU here, so its shards compute on the
# CPU), VEIL_CVM_IMAGE=DIR boots an image build-image.sh made before
# instead of building one, VEIL_CVM_MEM sets each guest's memory (default 1536M).
# The guests run under KVM where it works, else under TCG (VEIL_CVM_ACCEL=tcg
# forces TCG). Under KVM they serve the reference model; under TCG, which runs
# it some hundred times slower than native (one answer took minutes on a slow
# host), they serve a 2-layer random-weight model of the `smoke` shape that
# carries the reference model's vocabulary and chat template (the same
# tokenizer, template, kernels and protocol; the local reference runs it too).
# VEIL_CVM_MODEL=real|smoke chooses instead.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  '') ;;
  *) echo "check-cvm-cluster.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
esac
started=$SECONDS
say() { echo "[cvm $(( SECONDS - started ))s] $*"; }
skip() { echo "SKIP check-cvm-cluster: $*"; exit 0; }
fail() { echo "FAIL check-cvm-cluster: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root (network namespace, taps, debootstrap)"
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v cpio >/dev/null || need+=(cpio)
command -v mkfs.ext4 >/dev/null && command -v debugfs >/dev/null || need+=(e2fsprogs)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  (apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}") >/dev/null 2>&1 ||
    skip "cannot install ${need[*]}"
fi
[ -c /dev/net/tun ] || skip "no /dev/net/tun"
bin="${VEIL_BIN_DIR:-target/debug}"
for b in veil-shard veil veil-host veil-test-fixtures; do
  [ -x "$bin/$b" ] || fail "$bin/$b missing (cargo build, or set VEIL_BIN_DIR)"
done
bin="$(cd "$bin" && pwd)"
model="${VEIL_MODEL:-$(scripts/fetch-model.sh)}"
snp_measure="$(command -v sev-snp-measure || true)"
[ -n "$snp_measure" ] || { python3 -m pip install --quiet --disable-pip-version-check sev-snp-measure==0.0.13 &&
  snp_measure="$(command -v sev-snp-measure)"; } || fail "sev-snp-measure (PyPI) is not installable"

work="$(mktemp -d /tmp/veil-cvm.XXXXXX)"
ns="veilcvm$$"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  if [ -n "${VEIL_CVM_KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# 1. The guest image, with the project's recipe.
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if [ -n "${VEIL_CVM_IMAGE:-}" ]; then
  say "guest image from $VEIL_CVM_IMAGE (built before; not rebuilt)"
  mkdir -p "$work/guest" && cp "$VEIL_CVM_IMAGE"/{vmlinuz,initrd.img,cmdline,packages.txt} "$work/guest/"
else
  say "building the guest image (debootstrap from $mirror: NOT the pinned snapshot; packages.txt lists versions)"
  # shellcheck disable=SC2086 # VEIL_CVM_IMAGE_ARGS: words, e.g. --gpu
  deploy/cvm/build-image.sh --shard "$bin/veil-shard" --out "$work/guest" --mirror "$mirror" ${VEIL_CVM_IMAGE_ARGS:-} \
    > "$work/build.log" 2>&1 ||
    { tail -20 "$work/build.log"; fail "build-image.sh failed"; }
fi
kernel="$work/guest/vmlinuz" initrd="$work/guest/initrd.img" cmdline="$(cat "$work/guest/cmdline")"
say "guest: $(du -h "$initrd" | cut -f1) initrd, $(wc -l < "$work/guest/packages.txt") packages, cmdline: $cmdline"

# The accelerator: KVM where a guest kernel boots under it (nested KVM can
# fail), else TCG; and the model the guests serve under it.
accel=tcg cpu=max
if [ "${VEIL_CVM_ACCEL:-}" != tcg ] && [ -c /dev/kvm ] && timeout 20 qemu-system-x86_64 -accel kvm -cpu host -M q35 \
    -nodefaults -nographic -serial stdio -no-reboot -m 256 -kernel "$kernel" -append "console=ttyS0 panic=-1" 2>&1 |
    grep -q "Kernel panic"; then
  accel=kvm cpu=host
fi
served="${VEIL_CVM_MODEL:-}"
if [ -z "$served" ] && [ "$accel" = kvm ]; then served=real; elif [ -z "$served" ]; then served=smoke; fi
case "$served" in real|smoke) ;; *) fail "VEIL_CVM_MODEL must be real or smoke, not $served" ;; esac
say "accelerator: $accel (-cpu $cpu); the guests serve the $served model"

# 2. The launch measurement of exactly these files, ours and sev-snp-measure's.
ovmf="${OVMF:-}"
if [ -z "$ovmf" ]; then
  ovmf="$work/ovmf-fabricated.fd"
  "$bin/veil-test-fixtures" ovmf-with-kernel-hashes "$ovmf"
  say "firmware: no AmdSev OVMF given (OVMF=): a fabricated image with SNP kernel hashes stands in for it"
fi
measure_args=(--ovmf "$ovmf" --kernel "$kernel" --initrd "$initrd" --append "$cmdline" --vcpus 1 --vcpu-type EPYC-v4)
ours="$("$bin/veil" measure "${measure_args[@]}")"
theirs="$("$snp_measure" --mode snp --vmm-type QEMU --output-format hex "${measure_args[@]}")"
[ "$ours" = "$theirs" ] || fail "veil measure $ours != sev-snp-measure $theirs"
say "launch measurement $ours: veil measure = sev-snp-measure"

# 3. Weights disk, route, simulated root (reporting that measurement), policies, config disks.
mkdir -p "$work/weights" "$work/cfg"
if [ "$served" = real ]; then
  cp "$model" "$work/weights/model.gguf"
  n_layer=30
else
  "$bin/veil-shard" synth-model --shape smoke --vocab "$model" --out "$work/weights/model.gguf" 2>/dev/null ||
    fail "veil-shard synth-model failed"
  n_layer=2
fi
root="$("$bin/veil-shard" manifest --write "$work/weights/model.gguf" 2>/dev/null | awk 'NR == 1 {print $1}')"
mkfs.ext4 -q -L veil-weights -d "$work/weights" "$work/weights.img" "$(( $(du -sm "$work/weights" | cut -f1) + 16 ))M"
cat > "$work/cfg/route.toml" <<EOF
model = "$work/weights/model.gguf"
policy = "sim/policy.dev.toml"
simulated_root = "sim"
kv_budget_mib = 64
prefill_chunk = 64
heartbeat_ms = 2000
# Under TCG one round can take longer than the default minute on a slow host.
round_timeout_s = 600
weight_recheck_s = 0

[entry]
generate_listen = "127.0.0.1:7700"
sealed_listen = "10.77.0.10:7701"

[[stage]]
layers = [0, $(( n_layer / 2 ))]
manifest_root = "$root"
replicas = ["10.77.0.10:7710"]

[[stage]]
layers = [$(( n_layer / 2 )), $n_layer]
manifest_root = "$root"
replicas = ["10.77.0.11:7720", "10.77.0.12:7720"]
EOF
# The simulated root reports the measurement computed above and, once known,
# the route's HOST_DATA (the same seed gives the same keys and dev policy).
seed=5eed0fc0ffee
"$bin/veil" attest sim-init --seed "$seed" --measurement "$ours" "$work/cfg/sim" >/dev/null
host_data="$("$bin/veil-shard" config-digest --config "$work/cfg/route.toml")"
"$bin/veil" attest sim-init --force --seed "$seed" --measurement "$ours" --host-data "$host_data" "$work/cfg/sim" >/dev/null
# The client's policy, in one step from the reproduced values: the measurement,
# the config's HOST_DATA, and the shards' own peer policy by digest (it cannot
# pin the HOST_DATA that digests it). Started from the simulated root's dev policy.
cp "$work/cfg/sim/policy.dev.toml" "$work/client-policy.toml"
"$bin/veil" measure "${measure_args[@]}" --add-to "$work/client-policy.toml" --host-data "$host_data" \
  --peer-policy "$work/cfg/sim/policy.dev.toml" > /dev/null 2>&1 || fail "veil measure --add-to failed"
guests=("stage0-0 0 0 10.77.0.10" "stage1-0 1 0 10.77.0.11" "stage1-1 1 1 10.77.0.12")
for g in "${guests[@]}"; do
  read -r name stage replica addr <<<"$g"
  out="$(VEIL_SHARD="$bin/veil-shard" deploy/cvm/make-config-disk.sh --route "$work/cfg/route.toml" \
    --stage "$stage" --replica "$replica" --address "$addr/24" --gateway 10.77.0.1 --out "$work/$name.cfg.img" 2>/dev/null)"
  grep -q "host_data (hex): $host_data" <<<"$out" || fail "config disk $name: HOST_DATA differs ($out)"
done
say "config disks written; HOST_DATA $host_data (pinned in the client policy)"

# 4. The namespace, its bridge, and the accelerator.
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add veilbr0 type bridge
ip -n "$ns" addr add 10.77.0.1/24 dev veilbr0
ip -n "$ns" link set veilbr0 up
boot() {
  local name="$1" n
  case "$name" in stage0-0|evil-entry) n=0 ;; stage1-0) n=1 ;; stage1-1) n=2 ;; evil-env) n=3 ;; *) n=4 ;; esac
  ip netns exec "$ns" env VEIL_LAUNCH=emulated ACCEL="$accel" CPU="$cpu" BRIDGE=veilbr0 TAP="vt-$name" \
    MAC="52:54:00:77:00:1$n" KERNEL="$kernel" INITRD="$initrd" CMDLINE="$cmdline" VCPUS=1 MEM="${VEIL_CVM_MEM:-1536M}" \
    WEIGHTS="$work/weights.img" CONFIG="$work/$name.cfg.img" \
    deploy/cvm/launch-snp.sh >> "$work/$name.serial" 2>&1 &
  pids+=($!)
  eval "pid_${name//-/_}=$!"
}
boot stage0-0; boot stage1-0; boot stage1-1

ip netns exec "$ns" "$bin/veil-host" relay --entry 10.77.0.10:7701 --listen 10.77.0.1:8080 > "$work/relay.log" 2>&1 &
pids+=($!)
url=http://10.77.0.1:8080
verified=0
for _ in $(seq 1 120); do
  if ip netns exec "$ns" "$bin/veil" verify "$url" --policy "$work/client-policy.toml" > "$work/verify.log" 2>&1; then
    verified=1; break
  fi
  for g in stage0-0 stage1-0 stage1-1; do
    if grep -q "Kernel panic\|veil-shard.service: Failed with result" "$work/$g.serial"; then
      tail -30 "$work/$g.serial"; fail "guest $g did not start its shard"
    fi
  done
  sleep 5
done
if [ "$verified" != 1 ]; then
  for g in stage0-0 stage1-0 stage1-1; do echo "--- $g"; tail -15 "$work/$g.serial"; done
  cat "$work/verify.log"; fail "the route did not verify within 10 minutes"
fi
say "veil verify through the relay: accepted (simulated evidence, measurement and HOST_DATA pinned)"
grep -i "measurement\|host_data" "$work/verify.log" | head -4 || true
# A GPU image: with no GPU here the driver cannot bind, but its modules must
# be there for modprobe to find (a build that lost them fails on a GPU host).
if grep -q '^nvidia-open-kernel-support ' "$work/guest/packages.txt"; then
  if grep -a "modprobe: FATAL: Module nvidia" "$work/stage0-0.serial"; then
    fail "the GPU image lacks the NVIDIA modules its modprobe configuration names"
  fi
  grep -aq "NVRM:" "$work/stage0-0.serial" || fail "the GPU image's NVIDIA driver never ran (no NVRM line at boot)"
  say "GPU image: the NVIDIA modules load by name (no GPU here, so veil-gpu.service fails and the shards compute on the CPU):"
  grep -a "NVRM\|veil-gpu" "$work/stage0-0.serial" | head -4 || true
fi

# 5. One answer, compared with one local process.
prompt="Name three colours of the rainbow."
tokens=24
reference="$(VEIL_KERNELS=avx2 "$bin/veil-shard" generate --model "$work/weights/model.gguf" --chat --prompt "$prompt" \
  --max-tokens "$tokens" --temperature 0 2>/dev/null)"
# Long enough that the kill below lands mid-stream (it waits for 8 bytes).
[ "${#reference}" -ge 32 ] || fail "the local answer is too short to kill a stream in: $reference"
chat() {
  echo "$prompt" | ip netns exec "$ns" "$bin/veil" chat "$url" --policy "$work/client-policy.toml" \
    --temperature 0 --max-tokens "$tokens" 2>>"$work/chat.err"
}
answer="$(chat)"
[ "$answer" = "$reference" ] || fail "chat answer differs from one local process:
  local: $reference
  guests: $answer"
say "veil chat = one local process: $(head -c 60 <<<"$answer")…"

# 6. Kill the serving stage-1 guest mid-stream: the replica guest finishes it.
serving="$(grep -o 'data link up (peer attested).*addr=10\.77\.0\.1[12]' "$work/stage0-0.serial" | tail -1 | grep -o '10\.77\.0\.1[12]' || true)"
[ -n "$serving" ] || serving="$(grep -o 'addr=10\.77\.0\.1[12]:7720' "$work/stage0-0.serial" | tail -1 | grep -o '10\.77\.0\.1[12]' || true)"
case "$serving" in
  10.77.0.11) victim=stage1-0 ;;
  10.77.0.12) victim=stage1-1 ;;
  *) tail -20 "$work/stage0-0.serial"; fail "cannot tell which stage-1 guest serves" ;;
esac
: > "$work/stream.out"
chat > "$work/stream.out" &
chat_pid=$!
for _ in $(seq 1 600); do
  [ "$(wc -c < "$work/stream.out")" -ge 8 ] && break
  sleep 0.1
done
victim_pid="$(eval echo "\$pid_${victim//-/_}")"
kill -9 "$victim_pid"
killed_at="$(wc -c < "$work/stream.out")"
say "killed $victim's QEMU after $killed_at bytes of the answer"
wait "$chat_pid" || fail "the stream failed instead of failing over ($(tail -2 "$work/chat.err"))"
[ "$(cat "$work/stream.out")" = "$reference" ] || fail "after fail-over the answer differs:
  local: $reference
  guests: $(cat "$work/stream.out")"
[ "$killed_at" -lt "$(printf '%s\n' "$reference" | wc -c)" ] ||
  fail "the answer had ended before the kill ($killed_at bytes): no fail-over was exercised"
say "fail-over mid-stream to the replica guest: identical output"

# 7. Restart the killed guest; once it rejoins, kill the other replica: only the restarted one can answer.
lines_before="$(wc -l < "$work/$victim.serial")"
boot "$victim"
for _ in $(seq 1 120); do
  tail -n +"$lines_before" "$work/$victim.serial" | grep -q "shard listening" && break
  sleep 5
done
tail -n +"$lines_before" "$work/$victim.serial" | grep -q "shard listening" || fail "$victim did not restart"
other=stage1-0; [ "$victim" = stage1-0 ] && other=stage1-1
kill -9 "$(eval echo "\$pid_${other//-/_}")"
answer=""
for _ in $(seq 1 24); do
  answer="$(chat || true)"
  [ "$answer" = "$reference" ] && break
  sleep 5
done
[ "$answer" = "$reference" ] || fail "the restarted guest did not rejoin (answer: $answer)"
say "restarted $victim rejoined and answered alone: identical output"

# 8. The host writes every byte of the config disk. Three hostile disks, each
# refused where it must be (the first two by the guest, the third by the client):
#  a. guest.env with a shell command in a value: the guest's reader refuses it
#     (it parses guest.env, never sources it) and no shard starts;
#  b. a route with one more stage-1 replica, at an address the host chooses,
#     launched with the HOST_DATA clients pinned: the shard refuses to start
#     (its HOST_DATA does not commit to this route and peer policy);
#  c. the same route launched as the entry with its own digest as HOST_DATA:
#     the shard starts, and `veil verify` refuses the route on HOST_DATA.
kill -9 "$pid_stage0_0"
evil_route() { # DIR: the route above plus a replica at 10.77.0.13, its peer policy in DIR/sim
  sed 's|^replicas = \["10.77.0.11:7720", "10.77.0.12:7720"\]$|replicas = ["10.77.0.11:7720", "10.77.0.12:7720", "10.77.0.13:7720"]|' \
    "$work/cfg/route.toml" > "$1/route.toml"
  grep -q 10.77.0.13 "$1/route.toml" || fail "cannot write the hostile route"
}
mkdir -p "$work/evil-b" "$work/evil-c"
cp -r "$work/cfg/sim" "$work/evil-b/sim"          # still reports the pinned HOST_DATA
evil_route "$work/evil-b"
cp -r "$work/cfg/sim" "$work/evil-c/sim"
evil_route "$work/evil-c"
evil_host_data="$("$bin/veil-shard" config-digest --config "$work/evil-c/route.toml")"
[ "$evil_host_data" != "$host_data" ] || fail "the hostile route has the pinned HOST_DATA"
"$bin/veil" attest sim-init --force --seed "$seed" --measurement "$ours" --host-data "$evil_host_data" \
  "$work/evil-c/sim" >/dev/null
config_disk() { # NAME ROUTE STAGE REPLICA ADDRESS
  VEIL_SHARD="$bin/veil-shard" deploy/cvm/make-config-disk.sh --route "$2" --stage "$3" --replica "$4" \
    --address "$5/24" --gateway 10.77.0.1 --out "$work/$1.cfg.img" > /dev/null 2>&1 || fail "config disk $1"
}
config_disk evil-env "$work/cfg/route.toml" 1 1 10.77.0.12
printf 'VEIL_STAGE=1\nVEIL_REPLICA=1\nVEIL_ADDRESS=10.77.0.14/24; touch /run/veil/owned\n' > "$work/evil.env"
debugfs -w -R "rm guest.env" "$work/evil-env.cfg.img" >/dev/null 2>&1
debugfs -w -R "write $work/evil.env guest.env" "$work/evil-env.cfg.img" >/dev/null 2>&1
debugfs -R "cat guest.env" "$work/evil-env.cfg.img" 2>/dev/null | grep -q owned || fail "cannot write the hostile guest.env"
config_disk evil-route "$work/evil-b/route.toml" 1 2 10.77.0.13
config_disk evil-entry "$work/evil-c/route.toml" 0 0 10.77.0.10
boot evil-env; boot evil-route; boot evil-entry
refused_env="" refused_route="" refused_verify=""
for _ in $(seq 1 120); do
  if [ -z "$refused_env" ] && grep -q "guest.env: VEIL_ADDRESS must be dhcp" "$work/evil-env.serial"; then
    refused_env=1; say "hostile guest.env: refused by the guest (no shard started)"
  fi
  if [ -z "$refused_route" ] && grep -q "does not commit to this route and peer policy" "$work/evil-route.serial"; then
    refused_route=1; say "hostile route under the pinned HOST_DATA: the shard refused to start"
  fi
  if [ -z "$refused_verify" ] && grep -q "gateway: sealed requests" "$work/evil-entry.serial"; then
    if ip netns exec "$ns" "$bin/veil" verify "$url" --policy "$work/client-policy.toml" > "$work/evil-verify.log" 2>&1; then
      cat "$work/evil-verify.log"; fail "veil verify accepted an entry launched with another route's HOST_DATA"
    fi
    if grep -q "$evil_host_data" "$work/evil-verify.log"; then
      refused_verify=1; say "hostile route under its own HOST_DATA: veil verify refused it on HOST_DATA"
    fi
  fi
  [ -n "$refused_env" ] && [ -n "$refused_route" ] && [ -n "$refused_verify" ] && break
  sleep 5
done
for g in evil-env evil-route; do
  if grep -q "shard listening" "$work/$g.serial"; then tail -20 "$work/$g.serial"; fail "$g started a shard"; fi
done
[ -n "$refused_env" ] || { tail -20 "$work/evil-env.serial"; fail "the hostile guest.env was not refused"; }
[ -n "$refused_route" ] || { tail -20 "$work/evil-route.serial"; fail "the hostile route was not refused by its shard"; }
[ -n "$refused_verify" ] || { tail -20 "$work/evil-entry.serial"; cat "$work/evil-verify.log" 2>/dev/null;
  fail "veil verify did not refuse the hostile entry on HOST_DATA"; }
say "PASS: three guests, verify, chat, fail-over, rejoin, measurement, three hostile config disks refused ($accel)"
