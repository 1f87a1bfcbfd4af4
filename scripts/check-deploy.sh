#!/usr/bin/env bash
# Deployment material that can be checked without an SEV-SNP host:
#  - the shell scripts parse, and every deployment script answers --help;
#  - the guest initrd packing is reproducible (two copies of a tree, made in
#    another order at other times, pack to identical bytes);
#  - the Kubernetes trees render and validate (scripts/check-k8s.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

for s in deploy/cvm/*.sh deploy/k8s/*.sh scripts/*.sh; do
  bash -n "$s"
done
echo "shell scripts parse"

# Every deployment script answers --help with its usage, exit 0, and changes nothing.
for s in deploy/cvm/*.sh deploy/cvm/qemu-ifup deploy/k8s/*.sh; do
  before="$(git status --porcelain 2>/dev/null || true)"
  out="$("$s" --help 2>&1)" || { echo "$s --help failed: $out" >&2; exit 1; }
  grep -qi "usage" <<<"$out" || { echo "$s --help prints no usage: $out" >&2; exit 1; }
  [ "$before" = "$(git status --porcelain 2>/dev/null || true)" ] || { echo "$s --help changed files" >&2; exit 1; }
done
echo "deployment scripts answer --help"

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
