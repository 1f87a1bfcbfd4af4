#!/usr/bin/env bash
# Writes one guest's config disk: the route, its peer policy, which stage and
# replica this guest serves, and its network address. The disk is not part of
# the launch measurement (every guest boots the same image); the route and
# peer policy are bound through HOST_DATA instead: this prints the value to
# launch the guest with (QEMU `host-data=`, launch-snp.sh's HOST_DATA) and to
# pin in clients' policies (`veil policy set-host-data`). The shard refuses to
# start when HOST_DATA is not the digest of the route and policy it was given.
set -euo pipefail

usage() {
  cat <<'EOF2'
usage: make-config-disk.sh --route ROUTE --stage N --replica N --address ADDR/PREFIX|dhcp
                           [--gateway IP] [--dns IP] [--gpu-rim FILE]... [--gpu-ocsp FILE]...
                           --out DISK.img
       make-config-disk.sh --help

  --route ROUTE   the complete route (every stage's manifest_root set); its
                  `policy` file goes on the disk as the peer policy, its
                  `simulated_root` directory too (development only), and its
                  `model` becomes /models/FILE (the weights disk)
  --stage N, --replica N   which of the route's shards this guest is
  --address       the guest's IPv4 address with prefix, or dhcp; it must be
                  the address the route gives this replica
  --gateway, --dns optional
  --gpu-rim FILE  an NVIDIA RIM (driver or VBIOS) for this guest's GPU, as
                  NVIDIA's RIM service serves it: the shard carries it in its
                  evidence so clients can check `require_rim`; repeatable (it
                  is NVIDIA-signed, so the host may supply it)
  --gpu-ocsp FILE an OCSP response (DER) for the GPU's certificates; repeatable
  --out           the disk image (ext4, attached as the virtio disk with
                  serial veil-config)

Needs veil-shard (VEIL_SHARD, or on PATH) for the HOST_DATA digest, and
mkfs.ext4 (e2fsprogs). Prints HOST_DATA as base64 (QEMU's form) and hex.
EOF2
}

route="" stage="" replica="" address="" gateway="" dns="" out=""
rims=() ocsps=()
while [ $# -gt 0 ]; do
  case "$1" in
    --route) route="${2:?}"; shift 2 ;;
    --stage) stage="${2:?}"; shift 2 ;;
    --replica) replica="${2:?}"; shift 2 ;;
    --address) address="${2:?}"; shift 2 ;;
    --gateway) gateway="${2:?}"; shift 2 ;;
    --dns) dns="${2:?}"; shift 2 ;;
    --gpu-rim) rims+=("${2:?}"); shift 2 ;;
    --gpu-ocsp) ocsps+=("${2:?}"); shift 2 ;;
    --out) out="${2:?}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "make-config-disk.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$route" ] && [ -n "$stage" ] && [ -n "$replica" ] && [ -n "$address" ] && [ -n "$out" ] ||
  { usage >&2; exit 2; }
# The guest refuses anything else (it parses guest.env with these patterns): refuse it here first.
bad() { echo "make-config-disk.sh: $*" >&2; exit 2; }
ip4='([0-9]{1,3}\.){3}[0-9]{1,3}'
[[ "$stage" =~ ^[0-9]{1,3}$ ]] || bad "--stage must be a number"
[[ "$replica" =~ ^[0-9]{1,3}$ ]] || bad "--replica must be a number"
[ "$address" = dhcp ] || [[ "$address" =~ ^$ip4/[0-9]{1,2}$ ]] || bad "--address must be dhcp or IPv4/prefix (10.0.0.2/24)"
[ -z "$gateway" ] || [[ "$gateway" =~ ^$ip4$ ]] || bad "--gateway must be an IPv4 address"
[ -z "$dns" ] || [[ "$dns" =~ ^$ip4$ ]] || bad "--dns must be an IPv4 address"
shard="${VEIL_SHARD:-$(command -v veil-shard || true)}"
[ -x "$shard" ] || { echo "make-config-disk.sh: set VEIL_SHARD to veil-shard (or put it on PATH)" >&2; exit 2; }

value() { sed -n "s/^$1[[:space:]]*=[[:space:]]*\"\(.*\)\"[[:space:]]*$/\1/p" "$route" | head -1; }
resolve() { case "$1" in /*) echo "$1" ;; *) echo "$(cd "$(dirname "$route")" && pwd)/$1" ;; esac; }
policy="$(value policy)"; model="$(value model)"; sim="$(value simulated_root)"
[ -n "$policy" ] && [ -n "$model" ] || { echo "make-config-disk.sh: $route names no policy or model" >&2; exit 2; }

dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
install -m 0644 "$(resolve "$policy")" "$dir/peer-policy.toml"
sed -e "s|^policy[[:space:]]*=.*|policy = \"peer-policy.toml\"|" \
    -e "s|^model[[:space:]]*=.*|model = \"/models/$(basename "$model")\"|" \
    -e "s|^simulated_root[[:space:]]*=.*|simulated_root = \"sim\"|" "$route" > "$dir/route.toml"
# GPU reference material under fixed names (the guest accepts only these).
[ "${#rims[@]}" -le 8 ] || bad "at most 8 --gpu-rim files"
[ "${#ocsps[@]}" -le 32 ] || bad "at most 32 --gpu-ocsp files"
for i in "${!rims[@]}"; do
  mkdir -p "$dir/gpu"; install -m 0644 "${rims[$i]}" "$dir/gpu/rim-$i.xml"
done
for i in "${!ocsps[@]}"; do
  mkdir -p "$dir/gpu"; install -m 0644 "${ocsps[$i]}" "$dir/gpu/ocsp-$i.der"
done
if [ -n "$sim" ]; then
  cp -r "$(resolve "$sim")" "$dir/sim"
  echo "make-config-disk.sh: WARNING: the route names a SIMULATED attestation root: development only" >&2
fi
{
  echo "# Which shard this guest is (parsed by the guest, never sourced)."
  echo "VEIL_STAGE=$stage"
  echo "VEIL_REPLICA=$replica"
  echo "VEIL_ADDRESS=$address"
  [ -z "$gateway" ] || echo "VEIL_GATEWAY=$gateway"
  [ -z "$dns" ] || echo "VEIL_DNS=$dns"
} > "$dir/guest.env"

# The digest the guest will check its HOST_DATA against (and the route's own checks, early).
hex="$("$shard" config-digest --config "$dir/route.toml")"
b64="$("$shard" config-digest --config "$dir/route.toml" --base64)"
kib=$(( $(du -sk "$dir" | cut -f1) + 2048 ))
rm -f "$out"
mkfs.ext4 -q -L veil-config -d "$dir" "$out" "${kib}k"
echo "HOST_DATA=$b64"
echo "host_data (hex): $hex"
