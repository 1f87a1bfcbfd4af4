#!/usr/bin/env bash
# Deployment material that can be checked without an SEV-SNP host:
#  - the shell scripts parse;
#  - the guest initrd packing is reproducible (two copies of a tree, made in
#    another order at other times, pack to identical bytes);
#  - the Kubernetes trees render and validate (scripts/check-k8s.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

for s in deploy/cvm/*.sh deploy/k8s/*.sh scripts/*.sh; do
  bash -n "$s"
done
echo "shell scripts parse"

if ! command -v cpio >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq cpio) >/dev/null
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/a/etc/veil" "$work/a/usr/local/bin"
printf 'route\n' > "$work/a/etc/veil/route.toml"
printf 'bin\n' > "$work/a/usr/local/bin/veil-shard"
mkdir -p "$work/b/usr/local/bin" "$work/b/etc/veil"
printf 'bin\n' > "$work/b/usr/local/bin/veil-shard"
sleep 1
printf 'route\n' > "$work/b/etc/veil/route.toml"
one="$(deploy/cvm/build-image.sh --pack-only "$work/a" "$work/a.img" | cut -d' ' -f1)"
two="$(deploy/cvm/build-image.sh --pack-only "$work/b" "$work/b.img" | cut -d' ' -f1)"
if [ "$one" != "$two" ]; then
  echo "initrd packing is not reproducible: $one vs $two" >&2
  exit 1
fi
echo "initrd packing reproducible ($one)"

scripts/check-k8s.sh
