#!/usr/bin/env bash
# Regenerates the snp overlay's initdata (one Kata agent policy shared by
# every shard StatefulSet) from its rendered manifests and prints its
# HOST_DATA.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: deploy/k8s/make-initdata.sh [--check] [--release] [--overlay DIR]
       deploy/k8s/make-initdata.sh --help

Renders the overlay (default deploy/k8s/overlays/snp) with `kubectl kustomize`
and runs deploy/k8s/genpolicy.py on it. It writes ONE initdata document for
every StatefulSet in runtime class kata-qemu-snp (the entry and every later
stage), DIR/initdata/shards.toml: a Kata agent policy admitting the pause
container and the union of those StatefulSets' containers, each pinned to
its image digest, arguments, environment and mounts. It also writes
DIR/initdata/patch.yaml, the `io.katacontainers.config.hypervisor.cc_init_data`
annotation that DIR/kustomization.yaml applies to every StatefulSet, and
prints one line:

  HOST_DATA <sha256 of shards.toml>

The Kata runtime puts that value in the SEV-SNP HOST_DATA of every shard pod,
so one client pin covers every stage (`veil policy set-host-data POLICY HEX`).
Anyone can recompute it: `sha256sum DIR/initdata/shards.toml`.

While the overlay's images are placeholder digests (as committed) no policy
is written: the patch carries an annotation the Kata runtime cannot decode,
so no confidential pod starts, and no HOST_DATA is printed.

  --check     write nothing; exit 1 if the committed files are not what this
              would write (CI)
  --release   also exit 1 while the images are placeholders
  --overlay   another overlay folder (tests use a copy)
  --help      print this and change nothing
USAGE
}

check=() release=() overlay=""
while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h) usage; exit 0 ;;
    --check) check=(--check) ;;
    --release) release=(--release) ;;
    --overlay) overlay="${2:?--overlay needs a folder}"; shift ;;
    *) echo "make-initdata.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

here="$(cd "$(dirname "$0")" && pwd)"
overlay="${overlay:-$here/overlays/snp}"
patch="$overlay/initdata/patch.yaml"
if [ ! -s "$patch" ] && [ ${#check[@]} -eq 0 ]; then
  # First run: kustomize needs the file the overlay names; a patch that
  # changes nothing will do (the generator ignores the annotation anyway).
  mkdir -p "$overlay/initdata"
  printf 'apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: any\n' > "$patch"
fi
rendered="$(mktemp)"
trap 'rm -f "$rendered"' EXIT
kubectl kustomize "$overlay" > "$rendered"
python3 "$here/genpolicy.py" --manifests "$rendered" --containerfile "$here/Containerfile" \
  --out-dir "$overlay/initdata" "${check[@]}" "${release[@]}"
