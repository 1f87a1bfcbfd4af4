#!/usr/bin/env python3
"""Kata agent policy and initdata shared by every confidential StatefulSet,
generated from the rendered manifests (what Kata's `genpolicy` does, for this
project's pods only).

    kubectl kustomize deploy/k8s/overlays/snp > rendered.yaml
    deploy/k8s/genpolicy.py --manifests rendered.yaml --out-dir deploy/k8s/overlays/snp/initdata

(deploy/k8s/make-initdata.sh runs exactly this.) For the StatefulSets in
runtime class kata-qemu-snp (every shard stage) it writes ONE initdata
document, OUT/shards.toml, whose SHA-256 the Kata runtime puts in every shard
pod's HOST_DATA, and OUT/patch.yaml, the `cc_init_data` annotation (gzip,
then base64, of that document) that the overlay applies to every
StatefulSet, and prints `HOST_DATA <hex>` once. One document, because a
client policy pins one host_data and checks it against every shard of the
route. `--check` writes nothing and fails when either file differs from what
it would write (or another file is in OUT).

The policy (`package agent_policy`, Rego) admits CreateContainerRequest only
for the sandbox (pause) container and the union of the StatefulSets'
containers, each pinned to its image digest, its exact argument vector, its
exact environment and its mounts (and to pods named like its StatefulSet's,
a name the host picks); PullImageRequest only for those digests; and refuses
exec, file copies outside the pods' shared-file names, output streams, policy
replacement and every request it does not name. See POLICY_HEAD below for
what each rule checks and what it leaves to the runtime.

Input shape followed: the Kata agent's policy input as of Kata Containers
4.1.0 (src/agent/policy, src/tools/genpolicy/rules.rego there): Go-style
field names under input.OCI (Annotations, Process.Args, Process.Env, Mounts
with `type_`, Root), input.storages with the `image_guest_pull` driver whose
`source` is the image reference the guest pulls, CopyFileRequest pre-processed
into path/file_type/symlink_target. PullImageRequest (input.image) is the
older agents' request (the CCv0 branch); agents since 3.3 pull in the guest
through CreateContainerRequest's image_guest_pull storage, which is pinned
here, and never ask for it.

Facts about the images that the manifests do not state (the entrypoint,
working directory and environment the image config adds) are read from the
Containerfile stage that builds each image: an image whose repository ends
in `/shard` is the Containerfile's `shard` stage, and so on.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import json
import pathlib
import re
import shlex
import sys

import yaml

KATA_VERSION = "4.1.0"
RUNTIME_CLASS = "kata-qemu-snp"
ANNOTATION = "io.katacontainers.config.hypervisor.cc_init_data"
# What make-initdata.sh leaves in the annotation while the images are
# placeholders: not base64 of gzip, so the Kata runtime refuses to create the
# sandbox rather than start it with the guest's default policy.
UNSET_ANNOTATION = "unset: the snp overlay's images are placeholders; set their digests and run deploy/k8s/make-initdata.sh"
# containerd's PATH when an image sets none.
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# Where the runtime copies a container's files in the guest (no shared
# filesystem): <container id>-<16 random hex>-<name>. $(cid) is the id, which
# the policy reads from the container's root path.
SHARE_ROOT = r"^/run/kata-containers/shared/containers/(passthrough/)?(watchable/)?"
SHARED_FILE = SHARE_ROOT + r"$(cid)-[0-9a-f]{16}-"


class PolicyError(Exception):
    """The manifests ask for something this generator will not pin."""


def rx(text: str) -> str:
    """`text` as a regular expression matching only itself (escaping only the
    characters both Go's and Rust's regex syntax treat as special)."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)


# --------------------------------------------------------------------------
# Image references and placeholders

def split_digest(image: str) -> tuple[str, str | None]:
    """(repository, digest or None) of an image reference."""
    if "@" in image:
        repo, digest = image.rsplit("@", 1)
        return repo, digest
    return image, None


def is_placeholder_digest(digest: str) -> bool:
    """A digest nobody computed: all one hex digit (all-zero included) or a
    short pattern repeated (`deadbeef` * 8, `0123456789abcdef` * 4). A real
    SHA-256 is periodic with a period of 16 or less with odds of about 2^-192."""
    hexpart = digest.split(":", 1)[-1]
    return any(hexpart == hexpart[:p] * (len(hexpart) // p) for p in (1, 2, 4, 8, 16))


def pinned_digest(image: str, where: str) -> str:
    _, digest = split_digest(image)
    if digest is None or not DIGEST_RE.match(digest):
        raise PolicyError(f"{where}: image {image} is not pinned by a sha256 digest")
    return digest


# --------------------------------------------------------------------------
# What the images add (from the Containerfile)

class ImageConfig:
    def __init__(self) -> None:
        self.entrypoint: list[str] = []
        self.cmd: list[str] = []
        self.env: dict[str, str] = {}
        self.workdir = "/"


def containerfile_stages(text: str) -> dict[str, ImageConfig]:
    """The image config each named stage gives its image: ENTRYPOINT, CMD
    (JSON form only), ENV (`ENV K=V`, one per line) and WORKDIR. A stage
    inherits nothing it would need here: every stage of deploy/k8s/Containerfile
    starts from a plain base (no ENTRYPOINT/CMD/WORKDIR, PATH only)."""
    text = re.sub(r"\\\n", " ", text)
    stages: dict[str, ImageConfig] = {}
    current: ImageConfig | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            m = re.search(r"\s+AS\s+(\S+)\s*$", rest, re.IGNORECASE)
            current = ImageConfig()
            if m:
                stages[m.group(1)] = current
        elif current is None:
            continue
        elif word in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(rest)
            except json.JSONDecodeError:
                raise PolicyError(f"Containerfile: {word} {rest}: use the JSON form") from None
            if word == "ENTRYPOINT":
                current.entrypoint, current.cmd = value, []
            else:
                current.cmd = value
        elif word == "ENV":
            key, sep, value = rest.partition("=")
            if not sep or " " in key:
                raise PolicyError(f"Containerfile: ENV {rest}: write one KEY=VALUE per ENV line")
            current.env[key] = shlex.split(value)[0] if value else ""
        elif word == "WORKDIR":
            current.workdir = rest
    return stages


def image_config(image: str, stages: dict[str, ImageConfig], where: str) -> ImageConfig:
    repo, _ = split_digest(image)
    name = repo.rsplit("/", 1)[-1].split(":", 1)[0]
    if name not in stages:
        raise PolicyError(f"{where}: image {image}: no Containerfile stage named {name!r} tells its entrypoint and environment")
    return stages[name]


# --------------------------------------------------------------------------
# One container's pinned values

def refuse_expansion(values: list[str], where: str) -> None:
    for v in values:
        if re.search(r"\$\([A-Za-z_][A-Za-z0-9_]*\)", v):
            raise PolicyError(f"{where}: {v!r} uses $(VAR) expansion; the kubelet would rewrite it, so it cannot be pinned")


def oci_args(container: dict, cfg: ImageConfig) -> list[str]:
    """The argument vector the runtime sends (kubelet and containerd rules):
    `command` replaces the entrypoint and drops the image's CMD; `args`
    replaces CMD."""
    command, args = container.get("command"), container.get("args")
    if command:
        return list(command) + list(args or [])
    return list(cfg.entrypoint) + (list(args) if args is not None else list(cfg.cmd))


def oci_env(container: dict, cfg: ImageConfig, where: str) -> list[str]:
    if container.get("envFrom"):
        raise PolicyError(f"{where}: envFrom values are not in the manifests, so they cannot be pinned")
    env = dict(cfg.env) if cfg.env else {"PATH": DEFAULT_PATH.split("=", 1)[1]}
    for e in container.get("env", []) or []:
        if "valueFrom" in e:
            raise PolicyError(f"{where}: env {e['name']} uses valueFrom; only literal values can be pinned")
        env[e["name"]] = str(e.get("value", ""))
    pairs = [f"{k}={v}" for k, v in env.items()]
    refuse_expansion(pairs, where)
    return sorted(pairs)


def security(pod_spec: dict, container: dict, where: str) -> dict:
    pod_sc = pod_spec.get("securityContext", {}) or {}
    sc = container.get("securityContext", {}) or {}
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    if uid is None or gid is None:
        raise PolicyError(f"{where}: set runAsUser and runAsGroup, so that the policy can pin the user")
    if sc.get("privileged"):
        raise PolicyError(f"{where}: privileged containers are not admitted")
    caps = sc.get("capabilities", {}) or {}
    if "ALL" not in (caps.get("drop") or []) or caps.get("add"):
        raise PolicyError(f"{where}: drop ALL capabilities and add none (the policy admits an empty capability set only)")
    if sc.get("allowPrivilegeEscalation") is not False:
        raise PolicyError(f"{where}: set allowPrivilegeEscalation: false (the policy pins NoNewPrivileges)")
    if container.get("tty") or container.get("stdin"):
        raise PolicyError(f"{where}: tty and stdin are not admitted (no stream requests are)")
    return {
        "uid": int(uid),
        "gid": int(gid),
        "readonly_root": bool(sc.get("readOnlyRootFilesystem", False)),
    }


def kernel_mounts(with_cgroup: bool) -> list[dict]:
    """The mounts containerd gives every container (type and source fixed;
    options limited to containerd's, for cgroup2 with its newer flags)."""
    m = [
        ("/proc", "proc", "proc", ["nosuid", "noexec", "nodev"]),
        ("/dev", "tmpfs", "tmpfs", ["nosuid", "strictatime", "mode=755", "size=65536k"]),
        ("/dev/pts", "devpts", "devpts", ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]),
        ("/dev/mqueue", "mqueue", "mqueue", ["nosuid", "noexec", "nodev"]),
        ("/sys", "sysfs", "sysfs", ["nosuid", "noexec", "nodev", "ro"]),
        ("/dev/shm", "tmpfs", "shm", ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
    ]
    if with_cgroup:
        m.append(("/sys/fs/cgroup", "cgroup", "cgroup", ["nosuid", "noexec", "nodev", "relatime", "ro", "nsdelegate", "memory_recursiveprot"]))
    out = [{"destination": d, "type": t, "source": "^" + rx(s) + "$", "options": sorted(o)} for d, t, s, o in m]
    # Kata replaces /dev/shm with the sandbox's own.
    out.append({"destination": "/dev/shm", "type": "bind", "source": "^/run/kata-containers/sandbox/shm$", "options": ["rbind"]})
    return out


def shared_bind(destination: str) -> dict:
    """A file or folder the runtime copies into the guest's shared folder
    (no shared filesystem: CopyFileRequest) and binds at `destination`."""
    name = destination.rstrip("/").rsplit("/", 1)[-1]
    return {
        "destination": destination,
        "type": "bind",
        "source": SHARED_FILE + rx(name) + "$",
        "options": sorted(["rbind", "rprivate", "ro", "rw", "nosuid", "nodev", "noexec"]),
    }


def container_mounts(pod_spec: dict, container: dict, where: str) -> list[dict]:
    volumes = {v["name"]: v for v in pod_spec.get("volumes", []) or []}
    mounts = kernel_mounts(with_cgroup=True)
    for dest in ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", container.get("terminationMessagePath", "/dev/termination-log")):
        mounts.append(shared_bind(dest))
    for vm in container.get("volumeMounts", []) or []:
        vol = volumes.get(vm["name"])
        if vol is None:
            raise PolicyError(f"{where}: volumeMount {vm['name']} names no volume")
        if vm.get("subPath") or vm.get("subPathExpr"):
            raise PolicyError(f"{where}: volumeMount {vm['name']}: Kata does not support subPath")
        if "configMap" in vol and not vm.get("readOnly"):
            raise PolicyError(f"{where}: volumeMount {vm['name']}: a ConfigMap is admitted read-only only")
        if "persistentVolumeClaim" not in vol and "configMap" not in vol:
            kind = next((k for k in vol if k != "name"), "?")
            raise PolicyError(
                f"{where}: volume {vm['name']} is a {kind}; only persistentVolumeClaim and (read-only) configMap volumes are admitted"
            )
        if any(m["destination"] == vm["mountPath"] for m in mounts):
            raise PolicyError(f"{where}: volumeMount {vm['name']} at {vm['mountPath']} shadows a runtime mount")
        mounts.append(shared_bind(vm["mountPath"]))
    return mounts


def pinned_container(pod_spec: dict, container: dict, stages: dict[str, ImageConfig], where: str) -> dict:
    image = container["image"]
    digest = pinned_digest(image, where)
    cfg = image_config(image, stages, where)
    args = oci_args(container, cfg)
    if not args:
        raise PolicyError(f"{where}: no command, no args and no ENTRYPOINT: nothing to pin")
    refuse_expansion(args, where)
    sec = security(pod_spec, container, where)
    return {
        "name": container["name"],
        "image": image,
        "image_digest": digest,
        "args": args,
        "env": oci_env(container, cfg, where),
        "cwd": container.get("workingDir") or cfg.workdir,
        "uid": sec["uid"],
        "gid": sec["gid"],
        "readonly_root": sec["readonly_root"],
        "mounts": container_mounts(pod_spec, container, where),
    }


# --------------------------------------------------------------------------
# The policy data: every shard StatefulSet's pods and containers

def statefulset_pods(sts: dict, stages: dict[str, ImageConfig]) -> tuple[dict, list[dict]]:
    """One StatefulSet's pods (name pattern, namespace) and its pinned
    containers, each tagged with the StatefulSet's name."""
    name = sts["metadata"]["name"]
    namespace = sts["metadata"].get("namespace")
    if not namespace:
        raise PolicyError(f"StatefulSet {name}: no namespace in the rendered manifests")
    check_pod_settings(sts)
    pod = sts["spec"]["template"]["spec"]
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC") or pod.get("shareProcessNamespace"):
        raise PolicyError(f"StatefulSet {name}: host namespaces and a shared process namespace are not admitted")
    if pod.get("ephemeralContainers"):
        raise PolicyError(f"StatefulSet {name}: ephemeral containers are not admitted")
    containers = []
    for kind in ("initContainers", "containers"):
        for c in pod.get(kind, []) or []:
            pinned = pinned_container(pod, c, stages, f"StatefulSet {name} {kind[:-1]} {c['name']}")
            containers.append({"statefulset": name, **pinned})
    names = [c["name"] for c in containers]
    if len(set(names)) != len(names):
        raise PolicyError(f"StatefulSet {name}: container names repeat")
    # StatefulSet pods are named <statefulset>-<ordinal>.
    return {"statefulset": name, "namespace": namespace, "sandbox_name": "^" + rx(name) + "-[0-9]+$"}, containers


def policy_data(statefulsets: list[dict], stages: dict[str, ImageConfig]) -> dict:
    """The data of the one agent policy every shard pod gets: the union of
    the StatefulSets' pods and pinned containers."""
    if not statefulsets:
        raise PolicyError(f"no StatefulSet in runtime class {RUNTIME_CLASS}")
    pods, containers = [], []
    for sts in sorted(statefulsets, key=lambda d: d["metadata"]["name"]):
        p, cs = statefulset_pods(sts, stages)
        pods.append(p)
        containers += cs
    if len({p["statefulset"] for p in pods}) != len(pods):
        raise PolicyError("StatefulSet names repeat")
    copy_names = sorted({
        rx(m["destination"].rstrip("/").rsplit("/", 1)[-1])
        for c in containers for m in c["mounts"] if m["source"].startswith(SHARED_FILE)
    } | {rx("resolv.conf")})
    return {
        "generator": f"deploy/k8s/genpolicy.py (Kata {KATA_VERSION} agent input)",
        "statefulsets": [p["statefulset"] for p in pods],
        "pods": pods,
        "containers": containers,
        "sandbox": {
            "args": ["/pause"],
            "env": [DEFAULT_PATH],
            "mounts": kernel_mounts(with_cgroup=True) + [shared_bind("/etc/resolv.conf")],
        },
        "image_digests": sorted({c["image_digest"] for c in containers}),
        "copy_file_path": SHARE_ROOT + "[0-9a-zA-Z][0-9a-zA-Z._-]*-[0-9a-f]{16}-(" + "|".join(copy_names) + ")(/.*)?$",
        # (nerdctl/network-namespace: the pod network namespace's path, on the sandbox.)
        "annotation_prefixes": ["cdi.k8s.io/", "io.katacontainers.", "io.kubernetes.cri.", "nerdctl/network-namespace"],
        # Values the kubelet always adds: the API server's Service (the pod's
        # own Services are off: enableServiceLinks false is required).
        "runtime_env": [
            r"^KUBERNETES_SERVICE_HOST=[0-9a-fA-F.:]+$",
            r"^KUBERNETES_SERVICE_PORT(_HTTPS)?=[0-9]{1,5}$",
            r"^KUBERNETES_PORT=tcp://[0-9a-fA-F.:\[\]]+:[0-9]{1,5}$",
            r"^KUBERNETES_PORT_[0-9]{1,5}_TCP=tcp://[0-9a-fA-F.:\[\]]+:[0-9]{1,5}$",
            r"^KUBERNETES_PORT_[0-9]{1,5}_TCP_PROTO=tcp$",
            r"^KUBERNETES_PORT_[0-9]{1,5}_TCP_PORT=[0-9]{1,5}$",
            r"^KUBERNETES_PORT_[0-9]{1,5}_TCP_ADDR=[0-9a-fA-F.:]+$",
        ],
        "sysctls": ["net.ipv4.ip_unprivileged_port_start", "net.ipv4.ping_group_range"],
    }


def check_pod_settings(sts: dict) -> None:
    name = sts["metadata"]["name"]
    pod = sts["spec"]["template"]["spec"]
    if pod.get("enableServiceLinks") is not False:
        raise PolicyError(f"StatefulSet {name}: set enableServiceLinks: false (Service variables would be host-chosen environment)")
    if pod.get("automountServiceAccountToken") is not False:
        raise PolicyError(f"StatefulSet {name}: set automountServiceAccountToken: false")


# --------------------------------------------------------------------------
# The policy text

POLICY_HEAD = r"""# Kata agent policy shared by the pods of every shard StatefulSet, generated
# by deploy/k8s/genpolicy.py from the rendered snp overlay; do not edit.
# StatefulSets: {statefulsets}.
# One policy, so one initdata document and one HOST_DATA for every shard
# pod: a client policy pins one host_data.
# Input shape: the Kata agent's policy input as of Kata Containers {kata}.
#
# Admitted: the sandbox (pause) container, whose process comes from the guest
# image, and the containers of these StatefulSets, each only in a pod named
# like its StatefulSet's pods (the host picks pod names: this follows the
# manifests and is no security boundary) and only with its image digest
# (the image_guest_pull storage the guest pulls, and the image-name
# annotation), its argument vector, its environment (exactly; plus HOSTNAME
# and the API server's KUBERNETES_* variables), its user, working directory,
# read-only root, no capabilities, no OCI hooks, and only its mounts (each
# destination with its type and source), all from that one container's
# entry. Not pinned: devices (the GPU), the mount options beyond a fixed set,
# namespaces and masked paths.
# Refused: exec, reading or writing the containers' streams, replacing this
# policy, file copies other than the pods' shared files, and every request
# not named below.
package agent_policy

import future.keywords.every
import future.keywords.if
import future.keywords.in

default AllowRequestsFailingPolicy := false

# Requests decided by the rules below; false unless a rule admits them.
default AddARPNeighborsRequest := false
default CopyFileRequest := false
default CreateContainerRequest := false
default CreateSandboxRequest := false
default PullImageRequest := false
default UpdateInterfaceRequest := false
default UpdateRoutesRequest := false

# Requests never admitted.
default AddSwapPathRequest := false
default AddSwapRequest := false
default CloseStdinRequest := false
default ExecProcessRequest := false
default GetDiagnosticDataRequest := false
default GetIPTablesRequest := false
default GetMetricsRequest := false
default ListInterfacesRequest := false
default ListRoutesRequest := false
default MemAgentCompactConfig := false
default MemAgentMemcgConfig := false
default MemHotplugByProbeRequest := false
default PauseContainerRequest := false
default ReadStreamRequest := false
default ReseedRandomDevRequest := false
default ResizeVolumeRequest := false
default ResumeContainerRequest := false
default SetGuestDateTimeRequest := false
default SetIPTablesRequest := false
default SetPolicyRequest := false
default StartTracingRequest := false
default StopTracingRequest := false
default TtyWinResizeRequest := false
default UpdateContainerRequest := false
default UpdateEphemeralMountsRequest := false
default VolumeStatsRequest := false
default WriteStreamRequest := false

# Requests about what CreateSandbox/CreateContainer already admitted, or
# facts the host knows anyway: always admitted.
default DestroySandboxRequest := true
default GetOOMEventRequest := true
default GuestDetailsRequest := true
default OnlineCPUMemRequest := true
default RemoveContainerRequest := true
default RemoveStaleVirtiofsShareMountsRequest := true
default SignalProcessRequest := true
default StartContainerRequest := true
default StatsContainerRequest := true
default WaitProcessRequest := true

"""

POLICY_RULES = r"""
######################################################################
# Sandbox

CreateSandboxRequest if {
	count(object.get(input, "guest_hook_path", "")) == 0
	count(object.get(input, "kernel_modules", [])) == 0
	not input.sandbox_pidns
	every s in object.get(input, "storages", []) {
		sandbox_storage(s)
	}
}

sandbox_storage(s) if {
	s.driver == "ephemeral"
	s.source == "shm"
	s.fstype == "tmpfs"
	s.mount_point == "/run/kata-containers/sandbox/shm"
}

######################################################################
# Containers

CreateContainerRequest if {
	no_host_additions
	sandbox_name := input.OCI.Annotations["io.kubernetes.cri.sandbox-name"]
	some pod in policy_data.pods
	regex.match(pod.sandbox_name, sandbox_name)
	input.OCI.Annotations["io.kubernetes.cri.sandbox-namespace"] == pod.namespace
	admits_container(pod.statefulset, sandbox_name)
}

# Nothing the runtime could add to run code of the host's choosing: OCI
# hooks, shared mounts, a user by name, annotations outside the known ones,
# sysctls other than containerd's two.
no_host_additions if {
	count(object.get(input, "shared_mounts", [])) == 0
	object.get(input, "string_user", null) == null
	no_hooks(object.get(input.OCI, "Hooks", null))
	every key, _ in input.OCI.Annotations {
		known_annotation(key)
	}
	every key, _ in or_empty_object(object.get(input.OCI.Linux, "Sysctl", {})) {
		key in policy_data.sysctls
	}
}

no_hooks(hooks) if hooks == null

no_hooks(hooks) if {
	hooks != null
	every _, list in hooks {
		empty(list)
	}
}

empty(x) if x == null

empty(x) if {
	x != null
	count(x) == 0
}

or_empty_object(x) := {} if x == null

or_empty_object(x) := x if x != null

or_empty_array(x) := [] if x == null

or_empty_array(x) := x if x != null

known_annotation(key) if {
	some prefix in policy_data.annotation_prefixes
	startswith(key, prefix)
}

# The sandbox: the process, rootfs and mounts Kata gives every pod; the
# guest's own pause bundle runs (the storage's metadata says "sandbox").
admits_container(_, sandbox_name) if {
	a := input.OCI.Annotations
	a["io.kubernetes.cri.container-type"] == "sandbox"
	a["io.katacontainers.pkg.oci.container_type"] == "pod_sandbox"
	not a["io.kubernetes.cri.container-name"]
	pulled_as("sandbox", null)
	input.OCI.Process.Args == policy_data.sandbox.args
	every v in or_empty_array(object.get(input.OCI.Process, "Env", [])) {
		sandbox_env(v, sandbox_name)
	}
	mounts_allowed(policy_data.sandbox.mounts)
}

sandbox_env(v, _) if v in policy_data.sandbox.env

sandbox_env(v, sandbox_name) if v == concat("=", ["HOSTNAME", sandbox_name])

# One of that StatefulSet's containers, exactly as pinned: every value
# below from the same entry c.
admits_container(statefulset, sandbox_name) if {
	a := input.OCI.Annotations
	a["io.kubernetes.cri.container-type"] == "container"
	a["io.katacontainers.pkg.oci.container_type"] == "pod_container"
	some c in policy_data.containers
	c.statefulset == statefulset
	a["io.kubernetes.cri.container-name"] == c.name
	digest_of(a["io.kubernetes.cri.image-name"]) == c.image_digest
	pulled_as("container", c.image_digest)
	process_pinned(c, sandbox_name)
	input.OCI.Root.Readonly == c.readonly_root
	mounts_allowed(c.mounts)
}

# The container's rootfs is the image the guest pulls itself (by digest:
# the guest's image client checks the content against it), not something
# the host shares in.
pulled_as(kind, digest) if {
	count(input.storages) == 1
	s := input.storages[0]
	s.driver == "image_guest_pull"
	s.mount_point == input.OCI.Root.Path
	regex.match(`^/run/kata-containers/[0-9a-zA-Z][0-9a-zA-Z._-]*/rootfs$`, s.mount_point)
	pull_metadata(s)["io.kubernetes.cri.container-type"] == kind
	not pull_metadata(s)["io.kubernetes.cri-o.ContainerType"]
	source_digest_matches(s.source, digest)
}

source_digest_matches(_, digest) if digest == null

source_digest_matches(source, digest) if {
	digest != null
	digest_of(source) == digest
}

pull_metadata(s) := meta if {
	some opt in s.driver_options
	startswith(opt, "image_guest_pull=")
	meta := json.unmarshal(substring(opt, count("image_guest_pull="), -1)).metadata
}

digest_of(ref) := d if {
	parts := split(ref, "@")
	count(parts) == 2
	d := parts[1]
	regex.match(`^sha256:[0-9a-f]{64}$`, d)
}

process_pinned(c, sandbox_name) if {
	p := input.OCI.Process
	p.Args == c.args
	object.get(p, "Cwd", "") == c.cwd
	not p.Terminal
	p.NoNewPrivileges == true
	p.User.UID == c.uid
	p.User.GID == c.gid
	every _, caps in or_empty_object(object.get(p, "Capabilities", {})) {
		empty(caps)
	}
	env := or_empty_array(object.get(p, "Env", []))
	every v in env {
		env_allowed(c, v, sandbox_name)
	}
	every v in c.env {
		v in env
	}
}

env_allowed(c, v, _) if v in c.env

env_allowed(_, v, sandbox_name) if v == concat("=", ["HOSTNAME", sandbox_name])

env_allowed(_, v, _) if {
	some r in policy_data.runtime_env
	regex.match(r, v)
}

# Every mount of the request is one the pinned list allows (destination,
# type, source pattern, options within the allowed set), each destination
# once.
mounts_allowed(allowed) if {
	mounts := or_empty_array(object.get(input.OCI, "Mounts", []))
	count({m.destination | some m in mounts}) == count(mounts)
	every m in mounts {
		mount_allowed(allowed, m)
	}
}

mount_allowed(allowed, m) if {
	some a in allowed
	a.destination == m.destination
	a.type == m.type_
	regex.match(replace(a.source, "$(cid)", container_id_pattern), m.source)
	every o in object.get(m, "options", []) {
		o in a.options
	}
}

# The container's id, from its root path, as a pattern: a container binds
# only its own copied files.
container_id_pattern := replace(id, ".", `\.`) if {
	m := regex.find_all_string_submatch_n(`^/run/kata-containers/([0-9a-zA-Z][0-9a-zA-Z_-]*(\.[0-9a-zA-Z_-]+)*)/rootfs$`, input.OCI.Root.Path, 1)
	id := m[0][1]
}

######################################################################
# Images (agents that still ask: the CCv0 branch)

PullImageRequest if {
	digest_of(input.image) in policy_data.image_digests
}

######################################################################
# Files the runtime copies in (no shared filesystem): only below the
# pod's shared files (/etc/hosts, resolv.conf, the weights, ...), never a
# path with "..", symlinks only relative and below the top level.

CopyFileRequest if {
	no_dot_dot(input.path)
	regex.match(policy_data.copy_file_path, input.path)
	copy_file_kind_ok
}

copy_file_kind_ok if input.file_type in {"Regular", "Directory"}

copy_file_kind_ok if {
	input.file_type == "Symlink"
	regex.match(`^/run/kata-containers/shared/containers/[^/]+/.+$`, input.path)
	t := input.symlink_target
	not startswith(t, "/")
	no_dot_dot(t)
}

no_dot_dot(p) if not regex.match(`(^|/)\.\.($|/)`, p)

######################################################################
# Network set-up from the host: never on loopback.

UpdateInterfaceRequest if {
	i := input.interface
	i.name != "lo"
	bits.and(object.get(i, "raw_flags", 0), bits.negate(128)) == 0
}

UpdateRoutesRequest if {
	every r in input.routes.Routes {
		object.get(r, "device", "") != "lo"
		not loopback(object.get(r, "source", ""))
	}
}

AddARPNeighborsRequest if {
	every n in input.neighbors.ARPNeighbors {
		object.get(n, "device", "") != "lo"
		not loopback(n.toIPAddress.address)
	}
}

loopback(a) if regex.match(`^127\.`, a)

loopback(a) if regex.match(`^(0{0,4}:){2,7}0{0,3}1$`, a)
"""


def render_policy(data: dict) -> str:
    head = POLICY_HEAD.format(statefulsets=", ".join(data["statefulsets"]), kata=KATA_VERSION)
    body = "policy_data := " + json.dumps(data, indent=2, sort_keys=True) + "\n"
    text = head + body + POLICY_RULES
    if "'''" in text:
        raise PolicyError("the policy text holds ''' and cannot go in a TOML literal string")
    return text


def initdata_document(data: dict) -> str:
    return (
        f"# Initdata shared by the pods of StatefulSets {', '.join(data['statefulsets'])}:\n"
        "# generated by deploy/k8s/make-initdata.sh; do not edit. Its SHA-256 is\n"
        "# every one of these pods' HOST_DATA.\n"
        'algorithm = "sha256"\n'
        'version = "0.1.0"\n'
        "\n"
        "[data]\n"
        "\"policy.rego\" = '''\n" + render_policy(data) + "'''\n"
    )


def annotation_value(document: str) -> str:
    return base64.b64encode(gzip.compress(document.encode(), compresslevel=9, mtime=0)).decode()


def decode_annotation(value: str) -> str | None:
    try:
        return gzip.decompress(base64.b64decode(value, validate=True)).decode()
    except Exception:
        return None


def host_data(document: str) -> str:
    return hashlib.sha256(document.encode()).hexdigest()


# --------------------------------------------------------------------------
# The rendered manifests in, files out

def load_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def confidential_statefulsets(docs: list[dict]) -> list[dict]:
    return [
        d for d in docs
        if d.get("kind") == "StatefulSet" and d["spec"]["template"]["spec"].get("runtimeClassName") == RUNTIME_CLASS
    ]


def pod_images(sts: dict) -> list[str]:
    pod = sts["spec"]["template"]["spec"]
    return [c["image"] for kind in ("initContainers", "containers") for c in pod.get(kind, []) or []]


def has_placeholders(statefulsets: list[dict]) -> bool:
    return any(
        (d := split_digest(img)[1]) is not None and is_placeholder_digest(d)
        for sts in statefulsets for img in pod_images(sts)
    )


DOCUMENT = "shards.toml"
PATCH = "patch.yaml"


def document(docs: list[dict], containerfile: str) -> str:
    """The one initdata document of every confidential StatefulSet. Raises
    PolicyError."""
    return initdata_document(policy_data(confidential_statefulsets(docs), containerfile_stages(containerfile)))


def patch(value: str) -> str:
    """The annotation patch; overlays/snp/kustomization.yaml applies it to
    every StatefulSet (its `target`), so the name here is not used."""
    return (
        "# Generated by deploy/k8s/make-initdata.sh from the rendered overlay; do not edit.\n"
        "# One initdata for every shard StatefulSet (kustomization.yaml's target).\n"
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n"
        "  name: any\nspec:\n  template:\n    metadata:\n      annotations:\n"
        f"        {ANNOTATION}: {json.dumps(value)}\n"
    )


def outputs(docs: list[dict], containerfile: str) -> tuple[dict[str, str], bool]:
    """file name -> content for the out dir, and whether the images are
    placeholders (then no policy is written)."""
    if has_placeholders(confidential_statefulsets(docs)):
        return {PATCH: patch(UNSET_ANNOTATION)}, True
    doc = document(docs, containerfile)
    return {DOCUMENT: doc, PATCH: patch(annotation_value(doc))}, False


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifests", type=pathlib.Path, required=True, help="rendered overlay (kubectl kustomize deploy/k8s/overlays/snp)")
    ap.add_argument("--containerfile", type=pathlib.Path, default=pathlib.Path(__file__).with_name("Containerfile"))
    ap.add_argument("--out-dir", type=pathlib.Path, required=True)
    ap.add_argument("--check", action="store_true", help="write nothing; fail if the out dir differs")
    ap.add_argument("--release", action="store_true", help="fail on placeholder image digests")
    args = ap.parse_args(argv)
    try:
        files, placeholders = outputs(load_docs(args.manifests.read_text()), args.containerfile.read_text())
    except PolicyError as e:
        print(f"genpolicy: {e}", file=sys.stderr)
        return 1
    existing = {p.name for p in args.out_dir.glob("*") if p.is_file()} if args.out_dir.is_dir() else set()
    if args.check:
        stale = sorted(n for n, t in files.items() if not (args.out_dir / n).is_file() or (args.out_dir / n).read_text() != t)
        extra = sorted(existing - set(files))
        if stale or extra:
            print(f"{args.out_dir}: stale {stale}, not generated {extra}: run deploy/k8s/make-initdata.sh", file=sys.stderr)
            return 1
    else:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        # (patches.yaml and <statefulset>.toml: the earlier one-policy-per-stage layout.)
        for n in sorted(existing - set(files)):
            if n.endswith(".toml") or n in ("patches.yaml", PATCH):
                (args.out_dir / n).unlink()
        for n, t in files.items():
            (args.out_dir / n).write_text(t)
    if placeholders:
        print("genpolicy: the images are placeholder digests: no policy written, no HOST_DATA; the initdata "
              "annotation left cannot be decoded, so no pod starts. Set the digests (overlays/snp/kustomization.yaml) "
              "and run make-initdata.sh again.", file=sys.stderr)
        return 1 if args.release else 0
    print(f"HOST_DATA {host_data(files[DOCUMENT])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
