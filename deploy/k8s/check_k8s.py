#!/usr/bin/env python3
"""What scripts/check-k8s.sh checks beyond the Kubernetes schemas.

    check_k8s.py --rendered DIR [--test-render FILE] [--release]
    check_k8s.py --inject-test-digests K8S_COPY

DIR holds `dev.yaml` and `snp.yaml`, the committed overlays rendered by
`kubectl kustomize`. Refused, with one line each:

* images: in the snp overlay, any container image not pinned by a sha256
  digest; a placeholder digest (all one hex digit, or a short repeated
  pattern) with --release, and without it anywhere but the committed
  placeholder form (all of the overlay's images placeholders, initdata
  unset), which is then reported;
* the Containerfile: a `FROM` that is neither a digest-pinned reference, an
  earlier stage, nor a build argument without default; base-images.env
  values not pinned by digest, and placeholders there with --release;
* confidential pods: a StatefulSet outside runtime class kata-qemu-snp, a
  shard container without a GPU, a pod without initdata, StatefulSets whose
  initdata annotations differ (every shard pod must have the one HOST_DATA
  that a client policy pins); with real digests, initdata that does not
  decode, is not what genpolicy.py generates from this very render (one
  document for all the StatefulSets), or whose agent policy fails the policy
  checks below;
* the agent policy: CreateContainerRequest, PullImageRequest, CopyFileRequest
  or CreateSandboxRequest allowed by default or unconditionally; exec,
  stream, policy-replacement and failure-ignoring requests allowed at all;
  and, run with regorus (the Rego engine of the Kata agent), a policy that
  does not admit each stage's own sandbox and containers, that admits one
  with another image digest, argument, environment variable, mount, OCI hook
  or capability, or that admits a request mixing one stage's pinned values
  with another's (unless the mix is exactly a container pinned for that
  pod's StatefulSet);
* addresses: a route replica that is not its Service's ClusterIP:port, a
  Service count that differs from the route's replicas, a ClusterIP outside
  the service CIDR recorded in addresses.yaml or outside its static band, a
  relay pointed elsewhere than the entry's Service;
* a configMap volume naming no ConfigMap of the pod's namespace;
* GPUs: in the snp overlay, a shard container with a GPU limit that does not
  run `veil-shard serve` with `--hardware`, `--nvml-gpus` and one `--device
  cuda:N` (N below its GPU count), so would attest its GPU and compute on
  the CPU; in either overlay, a container of the shard image that runs
  veil-shard (its `cuda` build) with a GPU and sets LD_LIBRARY_PATH (the
  image's, /usr/local/lib/veil/cuda, must stay: the driver's libcuda.so.1
  comes from the guest), or without a GPU and does not name the image's
  driver stub after it (veil-shard would not start);
* the CUDA libraries: a Containerfile that does not build veil-shard with
  `veil-enclave/cuda` or whose shard stage does not set
  LD_LIBRARY_PATH=/usr/local/lib/veil/cuda; a cuda-libs.txt line not pinned
  by version and SHA-256; a CUDA runtime or NVRTC there other than the
  version scripts/cuda-toolchain.sh builds with.

`--test-render FILE` is the snp overlay rendered from a copy whose
placeholders were replaced by test digests (`--inject-test-digests`, as an
operator would after pushing) and whose initdata was regenerated: it gets
every check with the --release rules, so the committed placeholder form
cannot hide a policy or pinning fault.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import ipaddress
import json
import pathlib
import re
import shlex
import sys
import tomllib

import yaml

HERE = pathlib.Path(__file__).resolve().parent
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(HERE))
import genpolicy  # noqa: E402

SHARD_STATEFULSET = re.compile(r"^veil-(entry|stage[0-9]+)$")
GPU = "nvidia.com/gpu"
# The shard image's CUDA user libraries (its LD_LIBRARY_PATH), and the link
# stub of the driver's libcuda.so.1 that pods without a GPU add after them.
CUDA_LIBS = "/usr/local/lib/veil/cuda"
NO_DRIVER = "/usr/local/lib/veil/no-driver"
TOOLCHAIN = HERE.parent.parent / "scripts/cuda-toolchain.sh"
# Requests the policy must refuse unless a rule admits them, and that must
# never be admitted without conditions.
DECIDED_BY_RULES = ["CreateContainerRequest", "PullImageRequest", "CopyFileRequest", "CreateSandboxRequest"]
# Requests the policy must never admit: no rule may name them.
NEVER = [
    "AllowRequestsFailingPolicy", "ExecProcessRequest", "ReadStreamRequest", "WriteStreamRequest",
    "CloseStdinRequest", "SetPolicyRequest", "UpdateEphemeralMountsRequest", "GetDiagnosticDataRequest",
]


# --------------------------------------------------------------------------
# Images

def container_images(doc: dict) -> list[tuple[str, str]]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec") if doc.get("kind") != "Pod" else spec
    if not pod:
        return []
    return [(c["name"], c["image"]) for kind in ("initContainers", "containers") for c in pod.get(kind, []) or []]


def image_problems(docs: list[dict], release: bool) -> tuple[list[str], bool]:
    """Problems, and whether the images are all placeholders (the committed form)."""
    fail, placeholders, real = [], [], []
    for d in docs:
        for cname, image in container_images(d):
            where = f"snp: {d['kind']} {d['metadata']['name']}/{cname}"
            _, digest = genpolicy.split_digest(image)
            if digest is None or not genpolicy.DIGEST_RE.match(digest):
                fail.append(f"{where}: image {image} is not pinned by a sha256 digest")
            elif genpolicy.is_placeholder_digest(digest):
                placeholders.append(where)
                if release:
                    fail.append(f"{where}: image {image} has a placeholder digest")
            else:
                real.append(where)
    if placeholders and real and not release:
        fail.append(f"snp: some images are placeholders ({', '.join(placeholders)}), others not: set them all")
    return fail, bool(placeholders) and not real


def containerfile_problems(containerfile: str, base_images: str, release: bool) -> list[str]:
    fail = []
    text = re.sub(r"\\\n", " ", containerfile)
    global_args: dict[str, str | None] = {}
    stages: set[str] = set()
    seen_from = False
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "ARG" and not seen_from:
            name, _, default = words[1].partition("=")
            global_args[name] = default or None
        if words[0].upper() != "FROM":
            continue
        seen_from = True
        ref = next(w for w in words[1:] if not w.startswith("--"))
        m = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", ref)
        if m:
            if m.group(1) not in global_args:
                fail.append(f"Containerfile: FROM {ref}: no ARG {m.group(1)} before the first FROM")
            elif global_args[m.group(1)] is not None and "@sha256:" not in global_args[m.group(1)]:
                fail.append(f"Containerfile: ARG {m.group(1)} defaults to {global_args[m.group(1)]}, not a digest")
        elif ref in stages:
            pass
        elif not re.search(r"@sha256:[0-9a-f]{64}$", ref):
            fail.append(f"Containerfile: FROM {ref} is not pinned by digest")
        elif genpolicy.is_placeholder_digest(ref.rsplit("@", 1)[1]) and release:
            fail.append(f"Containerfile: FROM {ref} has a placeholder digest")
        if re.search(r"\s+AS\s+(\S+)\s*$", line, re.IGNORECASE):
            stages.add(re.search(r"\s+AS\s+(\S+)\s*$", line, re.IGNORECASE).group(1))
    values = dict(
        line.split("=", 1) for line in base_images.splitlines() if line.strip() and not line.startswith("#")
    )
    for name, default in global_args.items():
        if default is None and name not in values:
            fail.append(f"base-images.env: no value for the Containerfile's ARG {name}")
    for name, value in values.items():
        if not re.search(r"@sha256:[0-9a-f]{64}$", value):
            fail.append(f"base-images.env: {name}={value} is not pinned by digest")
        elif release and genpolicy.is_placeholder_digest(value.rsplit("@", 1)[1]):
            fail.append(f"base-images.env: {name} has a placeholder digest")
    return fail


def inject_test_digests(k8s: pathlib.Path) -> None:
    """Replace every placeholder digest in a copy of deploy/k8s by a test one
    (the SHA-256 of a label naming it as such): what an operator does after
    pushing, with values that are visibly nobody's image."""
    def test_digest(label: str) -> str:
        return hashlib.sha256(f"veil check-k8s test digest: {label}".encode()).hexdigest()

    kust = k8s / "overlays/snp/kustomization.yaml"
    data = yaml.safe_load(kust.read_text())
    for img in data.get("images", []):
        if genpolicy.is_placeholder_digest(img.get("digest", "sha256:0")):
            img["digest"] = "sha256:" + test_digest(img["name"])
    kust.write_text(yaml.safe_dump(data, sort_keys=False))
    env = k8s / "base-images.env"
    env.write_text(re.sub(
        r"^([A-Z_]+)=(.*)@sha256:([0-9a-f]{64})$",
        lambda m: m.group(0) if not genpolicy.is_placeholder_digest(m.group(3)) else f"{m.group(1)}={m.group(2)}@sha256:{test_digest(m.group(1))}",
        env.read_text(), flags=re.MULTILINE,
    ))


def set_placeholder_digests(k8s: pathlib.Path) -> None:
    """The committed form, in a copy of deploy/k8s: every snp image and base
    image an all-zero digest (tests use it whatever the tree holds)."""
    zero = "0" * 64
    kust = k8s / "overlays/snp/kustomization.yaml"
    data = yaml.safe_load(kust.read_text())
    for img in data.get("images", []):
        img["digest"] = "sha256:" + zero
    kust.write_text(yaml.safe_dump(data, sort_keys=False))
    env = k8s / "base-images.env"
    env.write_text(re.sub(r"@sha256:[0-9a-f]{64}$", "@sha256:" + zero, env.read_text(), flags=re.MULTILINE))


# --------------------------------------------------------------------------
# The agent policy

def lint_policy(text: str) -> list[str]:
    """Refusals that read the policy text: defaults and unconditional rules."""
    fail = []
    if not re.search(r"^package agent_policy\s*$", text, re.MULTILINE):
        fail.append("policy: not `package agent_policy`")
    for req in DECIDED_BY_RULES + NEVER:
        defaults = re.findall(rf"^\s*default\s+{req}\s*:?=\s*(\S+)", text, re.MULTILINE)
        if defaults != ["false"]:
            fail.append(f"policy: {req} must default to false (found {defaults or 'no default'})")
        for line in re.findall(rf"^\s*{req}\b(?!\s*:?=\s*false).*$", text, re.MULTILINE):
            if line.strip().startswith("default"):
                continue
            if req in NEVER:
                fail.append(f"policy: {req} must never be admitted, yet a rule names it: {line.strip()}")
            elif re.match(rf"^\s*{req}\s*(:?=\s*true|(if\s*)?\{{\s*true\s*\}}|if\s+true\s*$)", line):
                fail.append(f"policy: {req} admitted unconditionally: {line.strip()}")
    return fail


def kata_create_request(pinned: dict, sandbox_name: str, namespace: str, n: int = 1) -> dict:
    """A CreateContainerRequest as the Kata runtime sends it for `pinned`
    (one container of genpolicy.policy_data), in the Kata 4.1.0 input shape.
    Values a real runtime picks (ids, the random share names) are made up."""
    cid = hashlib.sha256(f"container {pinned['name']} {n}".encode()).hexdigest()
    sid = hashlib.sha256(f"sandbox {sandbox_name}".encode()).hexdigest()
    root = f"/run/kata-containers/{cid}/rootfs"
    shared = lambda name: f"/run/kata-containers/shared/containers/{cid}-{hashlib.sha256(name.encode()).hexdigest()[:16]}-{name}"
    annotations = {
        "io.katacontainers.pkg.oci.bundle_path": f"/run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}",
        "io.katacontainers.pkg.oci.container_type": "pod_container",
        "io.kubernetes.cri.container-name": pinned["name"],
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.image-name": pinned["image"],
        "io.kubernetes.cri.sandbox-id": sid,
        "io.kubernetes.cri.sandbox-name": sandbox_name,
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.sandbox-uid": "3cfbfd7a-3065-4862-805e-3f5e4142bcbd",
    }
    mounts = []
    for m in pinned["mounts"]:
        if m["source"].startswith(genpolicy.SHARED_FILE):
            source = shared(m["destination"].rsplit("/", 1)[-1])
            options = ["rbind", "rprivate", "ro" if m["destination"] == "/models" else "rw"]
        elif m["type"] == "bind":
            source, options = m["source"].strip("^$"), ["rbind"]
        else:
            source, options = m["source"].strip("^$"), [o for o in m["options"] if o not in ("nsdelegate", "memory_recursiveprot")]
        if m["destination"] == "/dev/shm" and m["type"] == "tmpfs":
            continue  # Kata's bind replaces containerd's tmpfs
        mounts.append({"destination": m["destination"], "options": options, "source": source, "type_": m["type"]})
    env = list(pinned["env"]) + [
        f"HOSTNAME={sandbox_name}",
        "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_SERVICE_PORT_HTTPS=443",
        "KUBERNETES_PORT=tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP_PROTO=tcp", "KUBERNETES_PORT_443_TCP_PORT=443", "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
    ]
    metadata = {k: v for k, v in annotations.items() if k.startswith(("io.kubernetes.cri.", "io.katacontainers.pkg."))}
    return {
        "OCI": {
            "Annotations": annotations,
            "Hooks": None,
            "Hostname": "",
            "Linux": {
                "CgroupsPath": f"kubepods-pod.slice:cri-containerd:{cid}",
                "Devices": [], "GIDMappings": [], "IntelRdt": None,
                "MaskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/sys/firmware"],
                "MountLabel": "",
                "Namespaces": [{"Path": "", "Type": "ipc"}, {"Path": "", "Type": "uts"}, {"Path": "", "Type": "mount"}],
                "ReadonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
                "Resources": {"BlockIO": None, "Devices": [], "HugepageLimits": [], "Network": None, "Pids": None},
                "RootfsPropagation": "", "Seccomp": None, "Sysctl": {"net.ipv4.ip_unprivileged_port_start": "0"},
                "UIDMappings": [],
            },
            "Mounts": mounts,
            "Process": {
                "ApparmorProfile": "", "Args": list(pinned["args"]),
                "Capabilities": {"Ambient": [], "Bounding": [], "Effective": [], "Inheritable": [], "Permitted": []},
                "ConsoleSize": None, "Cwd": pinned["cwd"], "Env": env, "NoNewPrivileges": True,
                "OOMScoreAdj": 1000, "Rlimits": [], "SelinuxLabel": "", "Terminal": False,
                "User": {"AdditionalGids": [pinned["gid"]], "GID": pinned["gid"], "UID": pinned["uid"], "Username": ""},
            },
            "Root": {"Path": root, "Readonly": pinned["readonly_root"]},
            "Solaris": None, "Version": "1.1.0", "Windows": None,
        },
        "container_id": cid,
        "devices": [],
        "exec_id": cid,
        "sandbox_pidns": False,
        "shared_mounts": [],
        "storages": [{
            "driver": "image_guest_pull",
            "driver_options": ["image_guest_pull=" + json.dumps({"metadata": metadata})],
            "fs_group": None, "fstype": "overlay", "mount_point": root, "options": [],
            "source": pinned["image"],
        }],
        "string_user": None,
    }


def kata_sandbox_request(sandbox_name: str, namespace: str) -> dict:
    """The pod's sandbox (pause) container's CreateContainerRequest."""
    pause = {
        "name": "", "image": "registry.k8s.io/pause:3.10", "args": ["/pause"], "cwd": "/", "uid": 65535, "gid": 65535,
        "readonly_root": True, "env": [genpolicy.DEFAULT_PATH],
        "mounts": [m for m in genpolicy.kernel_mounts(with_cgroup=False)] + [genpolicy.shared_bind("/etc/resolv.conf")],
    }
    req = kata_create_request(pause, sandbox_name, namespace, n=0)
    a = req["OCI"]["Annotations"]
    del a["io.kubernetes.cri.container-name"]
    a["io.kubernetes.cri.container-type"] = "sandbox"
    a["io.katacontainers.pkg.oci.container_type"] = "pod_sandbox"
    a["io.kubernetes.cri.sandbox-log-directory"] = f"/var/log/pods/{namespace}_{sandbox_name}_3cfbfd7a-3065-4862-805e-3f5e4142bcbd"
    a["nerdctl/network-namespace"] = "/var/run/netns/cni-2f4a1a8e-6c39-3f5d-0b8e-5c1d6e0f7a21"
    del a["io.kubernetes.cri.image-name"]
    meta = {k: v for k, v in a.items() if k.startswith("io.kubernetes.cri.")}
    req["storages"][0]["driver_options"] = ["image_guest_pull=" + json.dumps({"metadata": meta})]
    req["storages"][0]["source"] = "pause"
    req["OCI"]["Process"]["Env"] = [genpolicy.DEFAULT_PATH, f"HOSTNAME={sandbox_name}"]
    return req


class Evaluator:
    """The agent's question, `data.agent_policy.<Request>` for an input, put
    to regorus as the Kata agent puts it (it also accepts an object with
    `allowed`, which genpolicy's rules return)."""

    def __init__(self, policy_text: str) -> None:
        import regorus  # gordon-to-regorus on PyPI: regorus's Python binding

        self.engine = regorus.Engine()
        self.engine.set_rego_v0(True)  # the agent's regorus default; the policy parses either way
        self.engine.add_policy("policy.rego", policy_text)

    def allows(self, request: str, inp: dict) -> bool:
        self.engine.set_input(inp)
        res = self.engine.eval_query(f"data.agent_policy.{request}")
        if len(res.get("result", [])) != 1:
            return False
        value = res["result"][0]["expressions"][0]["value"]
        return value is True or (isinstance(value, dict) and value.get("allowed") is True)


def mutations(req: dict) -> list[tuple[str, dict]]:
    """Requests the host could send instead of `req`, each one a change that
    would run other code or let other data in; all must be refused."""
    out = []

    def m(label, f):
        r = copy.deepcopy(req)
        f(r)
        out.append((label, r))

    other = "sha256:" + hashlib.sha256(b"another image").hexdigest()
    swap = lambda ref: ref.rsplit("@", 1)[0] + "@" + other
    m("image digest (pulled)", lambda r: r["storages"][0].update(source=swap(r["storages"][0]["source"])))
    m("image digest (pulled and named)", lambda r: (r["storages"][0].update(source=swap(r["storages"][0]["source"])),
                                                     r["OCI"]["Annotations"].update({"io.kubernetes.cri.image-name": swap(r["OCI"]["Annotations"]["io.kubernetes.cri.image-name"])})))
    m("image by tag", lambda r: r["storages"][0].update(source=r["storages"][0]["source"].rsplit("@", 1)[0] + ":latest"))
    m("rootfs shared by the host", lambda r: r["storages"][0].update(driver="overlayfs"))
    m("rootfs as the pause bundle", lambda r: r["storages"][0].update(driver_options=[o.replace('"container"', '"sandbox"') for o in r["storages"][0]["driver_options"]]))
    m("last argument changed", lambda r: r["OCI"]["Process"]["Args"].__setitem__(-1, r["OCI"]["Process"]["Args"][-1] + " "))
    m("argument added", lambda r: r["OCI"]["Process"]["Args"].append("--verbose"))
    m("other program", lambda r: r["OCI"]["Process"]["Args"].__setitem__(0, "/models/run"))
    m("environment variable added", lambda r: r["OCI"]["Process"]["Env"].append("LD_PRELOAD=/models/x.so"))
    m("environment variable changed", lambda r: r["OCI"]["Process"]["Env"].__setitem__(0, r["OCI"]["Process"]["Env"][0] + ":/models"))
    m("environment variable removed", lambda r: r["OCI"]["Process"]["Env"].pop(0))
    m("mount added", lambda r: r["OCI"]["Mounts"].append({"destination": "/usr/local/bin", "options": ["rbind", "ro"], "source": r["OCI"]["Mounts"][-1]["source"], "type_": "bind"}))
    m("mount moved", lambda r: r["OCI"]["Mounts"][-1].update(destination="/etc/veil"))
    m("mount from elsewhere", lambda r: r["OCI"]["Mounts"][-1].update(source="/run/kata-containers/sandbox/storage/evil"))
    m("another container's files", lambda r: r["OCI"]["Mounts"][-1].update(source=r["OCI"]["Mounts"][-1]["source"].replace(r["container_id"], "f" * 64)))
    m("OCI hook", lambda r: r["OCI"].update(Hooks={"Prestart": [{"Path": "/models/hook"}]}))
    m("capability added", lambda r: r["OCI"]["Process"]["Capabilities"]["Effective"].append("CAP_SYS_PTRACE"))
    m("user root", lambda r: r["OCI"]["Process"]["User"].update(UID=0))
    m("privilege escalation", lambda r: r["OCI"]["Process"].update(NoNewPrivileges=False))
    m("terminal", lambda r: r["OCI"]["Process"].update(Terminal=True))
    m("working directory", lambda r: r["OCI"]["Process"].update(Cwd="/models"))
    m("writable root", lambda r: r["OCI"]["Root"].update(Readonly=not r["OCI"]["Root"]["Readonly"]))
    m("other container name", lambda r: r["OCI"]["Annotations"].update({"io.kubernetes.cri.container-name": "debug"}))
    m("other namespace", lambda r: r["OCI"]["Annotations"].update({"io.kubernetes.cri.sandbox-namespace": "default"}))
    m("other pod", lambda r: r["OCI"]["Annotations"].update({"io.kubernetes.cri.sandbox-name": "debug-0"}))
    m("unknown annotation", lambda r: r["OCI"]["Annotations"].update({"example.com/x": "y"}))
    m("sysctl", lambda r: r["OCI"]["Linux"].update(Sysctl={"kernel.core_pattern": "|/models/x"}))
    return out


# The fields of a pinned container that the policy compares with a request.
PINNED_FIELDS = ["name", "image", "args", "env", "cwd", "uid", "gid", "readonly_root", "mounts"]


def same_container(a: dict, b: dict) -> bool:
    return all(a[f] == b[f] for f in PINNED_FIELDS) and a["image_digest"] == b["image_digest"]


def admitted_in(c: dict, statefulset: str, containers: list[dict]) -> bool:
    """Whether the shared policy should admit container `c` (pinned values)
    in a pod of `statefulset`: only if that StatefulSet pins exactly it."""
    return any(p["statefulset"] == statefulset and same_container(p, c) for p in containers)


def mixed_containers(containers: list[dict]) -> list[tuple[str, dict, str]]:
    """(label, container, StatefulSet of the pod) for requests that mix one
    stage's pinned values with another's, or put one stage's container in
    another stage's pod: one policy holds every stage's containers, so it
    must not admit a field from one entry with the rest from another."""
    out = []
    statefulsets = sorted({c["statefulset"] for c in containers})
    for a in containers:
        for pod in statefulsets:
            if pod != a["statefulset"]:
                out.append((f"{a['statefulset']}/{a['name']} as it is", a, pod))
        for b in containers:
            if b is a:
                continue
            for f in PINNED_FIELDS:
                if a[f] == b[f]:
                    continue
                mixed = copy.deepcopy(a)
                mixed[f] = copy.deepcopy(b[f])
                if f == "image":
                    mixed["image_digest"] = b["image_digest"]
                for pod in sorted({a["statefulset"], b["statefulset"]}):
                    out.append((f"{a['statefulset']}/{a['name']} with the {f} of {b['statefulset']}/{b['name']}", mixed, pod))
    return out


def policy_behaviour_problems(policy_text: str, expected: dict, where: str) -> list[str]:
    """Run the policy: it admits every StatefulSet's sandbox and containers,
    refuses every mutation of them, admits a mix of two stages' pinned values
    only where that mix is exactly a container pinned for that pod's
    StatefulSet, and refuses the requests nobody needs."""
    fail = []
    try:
        ev = Evaluator(policy_text)
    except Exception as e:  # a policy regorus cannot parse admits nothing the agent could load
        return [f"{where}: policy does not load: {e}"]
    for pod in expected["pods"]:
        if not ev.allows("CreateContainerRequest", kata_sandbox_request(f"{pod['statefulset']}-1", pod["namespace"])):
            fail.append(f"{where}: policy refuses the sandbox container of {pod['statefulset']}'s pods")
    namespaces = {p["statefulset"]: p["namespace"] for p in expected["pods"]}
    for c in expected["containers"]:
        sts = c["statefulset"]
        req = kata_create_request(c, f"{sts}-1", namespaces[sts])
        if not ev.allows("CreateContainerRequest", req):
            fail.append(f"{where}: policy refuses container {sts}/{c['name']} as the manifests give it")
            continue
        for label, bad in mutations(req):
            if ev.allows("CreateContainerRequest", bad):
                fail.append(f"{where}: policy admits container {sts}/{c['name']} with {label}")
        if not ev.allows("PullImageRequest", {"image": c["image"]}):
            fail.append(f"{where}: policy refuses PullImageRequest for {c['image']}")
    for label, c, pod in mixed_containers(expected["containers"]):
        want = admitted_in(c, pod, expected["containers"])
        if ev.allows("CreateContainerRequest", kata_create_request(c, f"{pod}-1", namespaces[pod])) != want:
            fail.append(f"{where}: policy {'refuses' if want else 'admits'} {label} in a pod of {pod}")
    other = "registry.example.com/evil@sha256:" + hashlib.sha256(b"another image").hexdigest()
    shared = "/run/kata-containers/shared/containers/" + "a" * 64 + "-" + "b" * 16 + "-"
    refused = [
        ("PullImageRequest", {"image": other}),
        ("PullImageRequest", {"image": "registry.example.com/veil/shard:latest"}),
        ("ExecProcessRequest", {"container_id": "x", "process": {"Args": ["/bin/sh"]}}),
        ("SetPolicyRequest", {"policy": "package agent_policy\ndefault CreateContainerRequest := true"}),
        ("ReadStreamRequest", {}),
        ("WriteStreamRequest", {}),
        ("CopyFileRequest", {"path": "/usr/local/bin/veil-shard", "file_type": "Regular"}),
        ("CopyFileRequest", {"path": shared + "models/../../etc/x", "file_type": "Regular"}),
        ("CopyFileRequest", {"path": shared + "other", "file_type": "Regular"}),
        ("CopyFileRequest", {"path": shared + "models/a", "file_type": "Symlink", "symlink_target": "/etc/shadow"}),
        ("CreateSandboxRequest", {"guest_hook_path": "/models/hooks", "kernel_modules": [], "sandbox_pidns": False, "storages": []}),
        ("AllowRequestsFailingPolicy", {}),
    ]
    for req, inp in refused:
        if ev.allows(req, inp):
            fail.append(f"{where}: policy admits {req} {json.dumps(inp)[:80]}")
    admitted = [
        ("CopyFileRequest", {"path": shared + "models/SmolLM2.gguf", "file_type": "Regular"}),
        ("CreateSandboxRequest", {"guest_hook_path": "", "kernel_modules": [], "sandbox_pidns": False, "storages": [
            {"driver": "ephemeral", "driver_options": [], "source": "shm", "fstype": "tmpfs",
             "options": ["noexec", "nosuid", "nodev", "mode=1777", "size=67108864"],
             "mount_point": "/run/kata-containers/sandbox/shm", "fs_group": None}]}),
    ]
    # A mounted ConfigMap (the GPU reference material) arrives as Kubernetes
    # lays it out: files under a timestamped folder, `..data` linking to it,
    # and one relative link per key.
    if any(m["destination"] == "/etc/veil/gpu-reference" for c in expected["containers"] for m in c["mounts"]):
        admitted += [
            ("CopyFileRequest", {"path": shared + "gpu-reference/..2026_12_07_06_00_00.123", "file_type": "Directory"}),
            ("CopyFileRequest", {"path": shared + "gpu-reference/..2026_12_07_06_00_00.123/ocsp-0.der", "file_type": "Regular"}),
            ("CopyFileRequest", {"path": shared + "gpu-reference/..data", "file_type": "Symlink", "symlink_target": "..2026_12_07_06_00_00.123"}),
            ("CopyFileRequest", {"path": shared + "gpu-reference/ocsp-0.der", "file_type": "Symlink", "symlink_target": "..data/ocsp-0.der"}),
        ]
        refused.append(("CopyFileRequest", {"path": shared + "gpu-reference/x", "file_type": "Symlink", "symlink_target": "../../../etc/shadow"}))
        for req, inp in refused[-1:]:
            if ev.allows(req, inp):
                fail.append(f"{where}: policy admits {req} {json.dumps(inp)[:80]}")
    for req, inp in admitted:
        if not ev.allows(req, inp):
            fail.append(f"{where}: policy refuses {req} the pod needs: {json.dumps(inp)[:80]}")
    return fail


def confidential_problems(docs: list[dict], containerfile: str, placeholders: bool) -> list[str]:
    fail = []
    statefulsets = [d for d in docs if d["kind"] == "StatefulSet"]
    shard_sets = [d for d in statefulsets if SHARD_STATEFULSET.match(d["metadata"]["name"])]
    if len(shard_sets) < 3:
        fail.append(f"snp: {len(shard_sets)} shard StatefulSets; the overlay has three stages")
    annotations: dict[str, str | None] = {}
    for d in statefulsets:
        name = d["metadata"]["name"]
        spec = d["spec"]["template"]["spec"]
        if spec.get("runtimeClassName") != genpolicy.RUNTIME_CLASS:
            fail.append(f"snp: {name} is not in runtime class {genpolicy.RUNTIME_CLASS}")
        for c in spec["containers"]:
            if c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") is None:
                fail.append(f"snp: {name}/{c['name']} has no GPU")
        annotations[name] = d["spec"]["template"].get("metadata", {}).get("annotations", {}).get(genpolicy.ANNOTATION)
        if annotations[name] is None:
            fail.append(f"snp: {name} has no initdata")
    # One initdata, so one HOST_DATA, for every shard pod: a client policy
    # pins one host_data and checks it against every shard of the route.
    values = {v for v in annotations.values() if v is not None}
    if len(values) > 1:
        groups = sorted(sorted(n for n, v in annotations.items() if v == value) for value in values)
        fail.append(f"snp: the StatefulSets carry {len(values)} different initdata annotations ({groups}); every shard "
                    "pod must carry the same one, so that every shard has the one HOST_DATA clients pin: run make-initdata.sh")
    if not values:
        return fail
    if placeholders:
        if values != {genpolicy.UNSET_ANNOTATION}:
            fail.append("snp: images are placeholders but the initdata is not the unset marker")
        return fail
    stages = genpolicy.containerfile_stages(containerfile)
    try:
        expected = genpolicy.policy_data(genpolicy.confidential_statefulsets(docs), stages)
    except genpolicy.PolicyError as e:
        return fail + [f"snp: {e}"]
    want = genpolicy.initdata_document(expected)
    for value in sorted(values):
        names = sorted(n for n, v in annotations.items() if v == value)
        document = genpolicy.decode_annotation(value)
        if document is None:
            fail.append(f"snp: {', '.join(names)}: initdata annotation does not decode (base64 of gzip): run make-initdata.sh")
        elif document != want:
            fail.append(f"snp: {', '.join(names)}: initdata is not what genpolicy.py generates from this render: run make-initdata.sh")
    if not any(genpolicy.decode_annotation(v) == want for v in values):
        return fail
    try:
        policy = tomllib.loads(want)["data"]["policy.rego"]
    except (tomllib.TOMLDecodeError, KeyError) as e:
        return fail + [f"snp: initdata has no data.\"policy.rego\": {e}"]
    fail += [f"snp: {p}" for p in lint_policy(policy)]
    fail += policy_behaviour_problems(policy, expected, "snp")
    return fail


# --------------------------------------------------------------------------
# GPUs and the CUDA libraries

def containers_of(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec") if doc.get("kind") != "Pod" else spec
    return [c for kind in ("initContainers", "containers") for c in (pod or {}).get(kind, []) or []]


def gpu_limit(container: dict) -> int | None:
    value = (container.get("resources", {}) or {}).get("limits", {}).get(GPU)
    return None if value is None else int(str(value))


def is_shard_image(image: str) -> bool:
    repo, _ = genpolicy.split_digest(image)
    return repo.rsplit("/", 1)[-1].split(":", 1)[0] == "shard"


def runs_veil_shard(container: dict, stages: dict) -> bool:
    argv = genpolicy.oci_args(container, stages.get("shard", genpolicy.ImageConfig()))
    return any(re.search(r"(?<![\w-])veil-shard(?![\w-])", a) for a in argv)


def shard_command(container: dict, stages: dict) -> list[str] | None:
    """The arguments the container gives veil-shard: the argument vector as
    the runtime sends it (the shard image's ENTRYPOINT unless `command` is
    set) or, for `sh -c SCRIPT`, the script's words once the container's own
    literal variables ($VEIL_SERVE_FLAGS) are put in. None when it does not
    run veil-shard."""
    argv = genpolicy.oci_args(container, stages.get("shard", genpolicy.ImageConfig()))
    words = list(argv)
    if len(argv) >= 3 and argv[0] in ("/bin/sh", "sh", "/bin/bash", "bash") and argv[1] == "-c":
        env = {e["name"]: str(e.get("value", "")) for e in container.get("env", []) or [] if "valueFrom" not in e}
        script = re.sub(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))",
                        lambda m: env.get(m.group(1) or m.group(2), m.group(0)), argv[2])
        try:
            words = shlex.split(script)
        except ValueError:
            return None
    for i, w in enumerate(words):
        if w.rsplit("/", 1)[-1] == "veil-shard":
            return words[i + 1:]
    return None


def device_problems(docs: list[dict], stages: dict, label: str) -> list[str]:
    """Every shard container with a GPU limit serves with hardware
    attestation of that GPU (`--nvml-gpus`) and computes on it (`--device
    cuda:N`); without `--device` it would attest a GPU it never uses."""
    fail = []
    for d in docs:
        if d.get("kind") != "StatefulSet":
            continue
        for c in containers_of(d):
            gpus = gpu_limit(c)
            if gpus is None:
                continue
            where = f"{label}: {d['metadata']['name']}/{c['name']}"
            words = shard_command(c, stages)
            if not words or words[0] != "serve":
                fail.append(f"{where}: has a GPU but does not run `veil-shard serve`")
                continue
            for flag in ("--hardware", "--nvml-gpus"):
                if flag not in words:
                    fail.append(f"{where}: has a GPU but does not pass {flag}")
            mounts = {m["mountPath"].rstrip("/") for m in c.get("volumeMounts", []) or []}
            for i, w in enumerate(words[:-1]):
                if w == "--gpu-reference" and words[i + 1].rstrip("/") not in mounts:
                    fail.append(f"{where}: --gpu-reference {words[i + 1]} is not a volume mount")
            devices = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--device"]
            devices += [w.split("=", 1)[1] for w in words if w.startswith("--device=")]
            if not devices:
                fail.append(f"{where}: has {gpus} GPU(s) but passes no `--device cuda:N`: it would compute on the CPU")
            elif len(devices) > 1:
                fail.append(f"{where}: passes --device {len(devices)} times ({', '.join(devices)})")
            elif not (m := re.fullmatch(r"cuda:([0-9]+)", devices[0])):
                fail.append(f"{where}: has a GPU but computes on `{devices[0]}`, not `cuda:N`")
            elif int(m.group(1)) >= gpus:
                fail.append(f"{where}: --device {devices[0]}, but the pod has {gpus} GPU(s) (cuda:0 to cuda:{gpus - 1})")
    return fail


def cuda_library_problems(docs: list[dict], stages: dict, label: str) -> list[str]:
    """Where the `cuda` build of veil-shard finds libcuda.so.1: with a GPU,
    the driver's (the guest puts it in the container), so the container sets
    no LD_LIBRARY_PATH of its own; without one, the image's link stub
    (NO_DRIVER), without which veil-shard does not start."""
    fail = []
    want = f"{CUDA_LIBS}:{NO_DRIVER}"
    for d in docs:
        for c in containers_of(d):
            if not is_shard_image(c.get("image", "")) or not runs_veil_shard(c, stages):
                continue
            where = f"{label}: {d['kind']} {d['metadata']['name']}/{c['name']}"
            env = {e["name"]: e.get("value") for e in c.get("env", []) or []}
            if gpu_limit(c) is not None:
                if "LD_LIBRARY_PATH" in env:
                    fail.append(f"{where}: has a GPU yet sets LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}: keep the image's "
                                f"({CUDA_LIBS}), so that libcuda.so.1 is the driver's, never the stub in {NO_DRIVER}")
            elif env.get("LD_LIBRARY_PATH") != want:
                fail.append(f"{where}: runs veil-shard (the cuda build) without a GPU: set LD_LIBRARY_PATH={want} "
                            "(the driver stub), or it does not start")
    return fail


def cuda_libs_problems(containerfile: str, cuda_libs: str, toolchain: str) -> list[str]:
    """The Containerfile builds and ships what the shard needs on a GPU, and
    cuda-libs.txt pins wheels of the CUDA release the build uses."""
    fail = []
    text = re.sub(r"\\\n", " ", containerfile)
    if not re.search(r"cargo build[^\n]*--features[= ][^\s]*veil-enclave/cuda", text):
        fail.append("Containerfile: veil-shard is not built with --features veil-enclave/cuda: the shard image would not use its GPU")
    shard = genpolicy.containerfile_stages(containerfile).get("shard")
    if shard is None or shard.env.get("LD_LIBRARY_PATH") != CUDA_LIBS:
        got = None if shard is None else shard.env.get("LD_LIBRARY_PATH")
        fail.append(f"Containerfile: the shard stage's LD_LIBRARY_PATH is {got}, not {CUDA_LIBS} (the CUDA libraries; never the driver stub)")
    pins: dict[str, str] = {}
    for line in cuda_libs.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][0-9A-Za-z.]*)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        if not m:
            fail.append(f"cuda-libs.txt: {line!r} is not NAME==VERSION --hash=sha256:HEX")
            continue
        pins[m.group(1)] = m.group(2)
    tool = dict(re.findall(r"^([A-Z]+)=([0-9][0-9.]*)\s*$", toolchain, re.MULTILINE))
    for package, var in (("nvidia-cuda-runtime", "RUNTIME"), ("nvidia-cuda-nvrtc", "NVCC")):
        if package not in pins:
            fail.append(f"cuda-libs.txt: no {package}")
        elif pins[package] != tool.get(var):
            fail.append(f"cuda-libs.txt: {package}=={pins[package]}, but scripts/cuda-toolchain.sh builds with {var}={tool.get(var)}")
    for package in ("nvidia-cublas", "nvidia-curand"):
        if package not in pins:
            fail.append(f"cuda-libs.txt: no {package}")
    return fail


# --------------------------------------------------------------------------
# Addresses

def route_problems(docs: list[dict], overlay: pathlib.Path, label: str) -> list[str]:
    fail = []
    route = tomllib.loads((overlay / "route.toml").read_text())
    header = (overlay / "addresses.yaml").read_text().splitlines()[0]
    m = re.match(r"^# Generated by deploy/k8s/set-addresses\.py --service-cidr (\S+) --first (\d+);", header)
    if not m:
        return [f"{label}: addresses.yaml has no generator line"]
    network = ipaddress.ip_network(m.group(1))
    band = [network.network_address + i for i in range(min(max(16, network.num_addresses // 16), 256))]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    shard_services = sorted(n for n in services if SHARD_STATEFULSET.match(n) or re.match(r"^veil-stage[0-9]+-[0-9]+$", n))
    want_services = []
    for i, stage in enumerate(route["stage"]):
        for j, addr in enumerate(stage["replicas"]):
            name = "veil-entry" if i == 0 else f"veil-stage{i}-{j}"
            want_services.append(name)
            svc = services.get(name)
            if svc is None:
                fail.append(f"{label} route: stage {i} replica {j} ({addr}) has no Service {name}")
                continue
            ip, port = addr.rsplit(":", 1)
            ip = ip.strip("[]")
            cluster_ip = svc["spec"].get("clusterIP")
            if cluster_ip != ip:
                fail.append(f"{label} route: stage {i} replica {j} is {addr}, Service {name}'s ClusterIP is {cluster_ip}")
            if i > 0 and int(port) not in [p["port"] for p in svc["spec"]["ports"]]:
                fail.append(f"{label} route: stage {i} replica {j} port {port} is not a port of Service {name}")
    if sorted(want_services) != shard_services:
        fail.append(f"{label}: shard Services {shard_services} differ from the route's replicas {sorted(want_services)}")
    for name in shard_services:
        cluster_ip = services[name]["spec"].get("clusterIP")
        if cluster_ip is None:
            fail.append(f"{label}: Service {name} has no fixed ClusterIP")
        elif ipaddress.ip_address(cluster_ip) not in network:
            fail.append(f"{label}: Service {name}'s ClusterIP {cluster_ip} is outside the service CIDR {network}")
        elif ipaddress.ip_address(cluster_ip) not in band:
            fail.append(f"{label}: Service {name}'s ClusterIP {cluster_ip} is outside {network}'s static band")
    entry = services.get("veil-entry")
    sealed = route["entry"]["sealed_listen"].rsplit(":", 1)[1]
    if entry and int(sealed) not in [p["port"] for p in entry["spec"]["ports"]]:
        fail.append(f"{label} route: the entry's sealed port {sealed} is not Service veil-entry's")
    relay = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "veil-relay"]
    if entry and relay:
        args = relay[0]["spec"]["template"]["spec"]["containers"][0].get("args", [])
        want = f"{entry['spec'].get('clusterIP')}:{sealed}"
        if "--entry" not in args or args[args.index("--entry") + 1] != want:
            fail.append(f"{label}: the relay's --entry is not {want} (Service veil-entry)")
    return fail


def configmap_problems(docs: list[dict], label: str) -> list[str]:
    fail = []
    maps = {(d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs if d["kind"] == "ConfigMap"}
    for d in docs:
        pod = d.get("spec", {}).get("template", {}).get("spec")
        for v in (pod or {}).get("volumes", []) or []:
            # An optional ConfigMap is the operator's to create (the GPU
            # reference material: deploy/README.md, Kubernetes).
            if v.get("configMap", {}).get("optional"):
                continue
            if "configMap" in v and (d["metadata"].get("namespace"), v["configMap"]["name"]) not in maps:
                fail.append(f"{label}: {d['kind']} {d['metadata']['name']} mounts ConfigMap {v['configMap']['name']}, which its namespace lacks")
    return fail


# --------------------------------------------------------------------------

def load(path: pathlib.Path) -> list[dict]:
    return genpolicy.load_docs(path.read_text())


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rendered", type=pathlib.Path, help="folder with dev.yaml and snp.yaml")
    ap.add_argument("--test-render", type=pathlib.Path, help="the snp overlay rendered with test digests")
    ap.add_argument("--release", action="store_true", help="refuse placeholders")
    ap.add_argument("--inject-test-digests", type=pathlib.Path, metavar="K8S_COPY")
    args = ap.parse_args(argv)
    if args.inject_test_digests:
        inject_test_digests(args.inject_test_digests)
        return 0
    if not args.rendered:
        ap.error("--rendered is required")
    containerfile = (HERE / "Containerfile").read_text()
    stages = genpolicy.containerfile_stages(containerfile)
    fail = containerfile_problems(containerfile, (HERE / "base-images.env").read_text(), args.release)
    fail += cuda_libs_problems(containerfile, (HERE / "cuda-libs.txt").read_text(), TOOLCHAIN.read_text())
    dev, snp = load(args.rendered / "dev.yaml"), load(args.rendered / "snp.yaml")
    fail += route_problems(dev, HERE / "overlays/dev", "dev")
    fail += configmap_problems(dev, "dev")
    fail += cuda_library_problems(dev, stages, "dev")
    fail += route_problems(snp, HERE / "overlays/snp", "snp")
    fail += configmap_problems(snp, "snp")
    fail += device_problems(snp, stages, "snp")
    fail += cuda_library_problems(snp, stages, "snp")
    image_fail, placeholders = image_problems(snp, args.release)
    fail += image_fail
    fail += confidential_problems(snp, containerfile, placeholders and not args.release)
    notes = []
    if placeholders and not args.release:
        notes.append("snp: committed images and base images are placeholders (refused with --release)")
    if args.test_render:
        test = load(args.test_render)
        test_fail, test_placeholders = image_problems(test, release=True)
        fail += [f"test render: {p}" for p in test_fail]
        fail += [f"test render: {p}" for p in confidential_problems(test, containerfile, False)]
        fail += [f"test render: {p}" for p in route_problems(test, HERE / "overlays/snp", "snp")]
        fail += [f"test render: {p}" for p in device_problems(test, stages, "snp")]
        fail += [f"test render: {p}" for p in cuda_library_problems(test, stages, "snp")]
        notes.append(f"snp with test digests: {sum(1 for d in test if d['kind'] == 'StatefulSet')} StatefulSets, one initdata; "
                     "its policy linted and run: admits each stage's containers, refuses them with another image, argument, "
                     "environment, mount, hook or capability, and refuses mixes of two stages' values")
    if fail:
        print("\n".join(fail), file=sys.stderr)
        return 1
    for n in notes:
        print(n)
    print("checked: pins, placeholders, agent policies, route <-> Services, ConfigMap references, "
          "GPU shards' --device and --nvml-gpus, CUDA library paths and wheel pins")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
