#!/usr/bin/env python3
"""Tests of deploy/k8s's generators and of what check_k8s.py refuses (run by
scripts/check-k8s.sh; needs kubectl, PyYAML and regorus).

The snp overlay is rendered from a copy of deploy/k8s whose placeholder
digests are replaced by test ones, as an operator's would be after pushing.
"""

from __future__ import annotations

import copy
import hashlib
import pathlib
import shutil
import subprocess
import sys
import tempfile
import tomllib
import unittest

HERE = pathlib.Path(__file__).resolve().parent
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(HERE))
import check_k8s as ck  # noqa: E402
import genpolicy  # noqa: E402

OLD_HAND_WRITTEN_POLICY = """package agent_policy

default CopyFileRequest := false
default CreateContainerRequest := true
default CreateSandboxRequest := true
default ExecProcessRequest := false
default PullImageRequest := true
default ReadStreamRequest := false
default SetPolicyRequest := false
"""


def run(*cmd: str | pathlib.Path, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=check)


def render(overlay: pathlib.Path) -> list[dict]:
    return genpolicy.load_docs(run("kubectl", "kustomize", overlay, check=True).stdout)


def tree_digest(root: pathlib.Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


STAGES = ["veil-entry", "veil-stage1", "veil-stage2"]


def statefulset(docs: list[dict], name: str) -> dict:
    return next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == name)


class K8sTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = pathlib.Path(tempfile.mkdtemp(prefix="veil-k8s-test-"))
        # The committed form (placeholders), whatever this tree holds.
        cls.placeholder_copy = cls.tmp / "placeholder"
        shutil.copytree(HERE, cls.placeholder_copy, ignore=shutil.ignore_patterns("__pycache__"))
        ck.set_placeholder_digests(cls.placeholder_copy)
        run(cls.placeholder_copy / "make-initdata.sh", "--overlay", cls.placeholder_copy / "overlays/snp", check=True)
        cls.k8s = cls.tmp / "k8s"
        shutil.copytree(HERE, cls.k8s, ignore=shutil.ignore_patterns("__pycache__"))
        ck.inject_test_digests(cls.k8s)
        run(cls.k8s / "make-initdata.sh", "--overlay", cls.k8s / "overlays/snp", check=True)
        cls.docs = render(cls.k8s / "overlays/snp")
        cls.containerfile = (HERE / "Containerfile").read_text()

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp)

    def host_data(self, docs: list[dict]) -> str:
        return genpolicy.host_data(genpolicy.document(docs, self.containerfile))

    def changed(self, mutate) -> bool:
        """Whether a change to the rendered manifests moves the HOST_DATA."""
        docs = copy.deepcopy(self.docs)
        mutate(docs)
        return self.host_data(self.docs) != self.host_data(docs)

    def shard(self, docs: list[dict], name: str) -> dict:
        return statefulset(docs, name)["spec"]["template"]["spec"]["containers"][0]

    # ---------------------------------------------------------------- HOST_DATA

    def test_one_initdata_for_every_shard_statefulset(self):
        files, placeholders = genpolicy.outputs(self.docs, self.containerfile)
        self.assertFalse(placeholders)
        self.assertEqual(sorted(files), ["patch.yaml", "shards.toml"])
        self.assertEqual(sorted(p.name for p in (self.k8s / "overlays/snp/initdata").iterdir()), ["patch.yaml", "shards.toml"])
        toml = (self.k8s / "overlays/snp/initdata/shards.toml").read_text()
        self.assertEqual(files["shards.toml"], toml)
        names = [d["metadata"]["name"] for d in self.docs if d["kind"] == "StatefulSet"]
        self.assertEqual(sorted(names), STAGES)
        for name in names:
            annotation = statefulset(self.docs, name)["spec"]["template"]["metadata"]["annotations"][genpolicy.ANNOTATION]
            self.assertEqual(genpolicy.decode_annotation(annotation), toml, name)
        data = genpolicy.policy_data(genpolicy.confidential_statefulsets(self.docs), genpolicy.containerfile_stages(self.containerfile))
        self.assertEqual(data["statefulsets"], STAGES)
        self.assertEqual(sorted(c["statefulset"] for c in data["containers"]), STAGES)

    def test_generator_is_deterministic(self):
        self.assertEqual(self.host_data(self.docs), self.host_data(copy.deepcopy(self.docs)))
        self.assertEqual(self.host_data(self.docs), self.host_data(render(self.k8s / "overlays/snp")))
        self.assertFalse(self.changed(lambda docs: docs.reverse()))

    def test_host_data_is_the_sha256_of_the_committed_document(self):
        r = run(self.k8s / "make-initdata.sh", "--overlay", self.k8s / "overlays/snp", "--check", check=True)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 1, r.stdout)
        sha256sum = run("sha256sum", self.k8s / "overlays/snp/initdata/shards.toml", check=True).stdout.split()[0]
        self.assertEqual(lines[0], f"HOST_DATA {sha256sum}")
        self.assertEqual(self.host_data(self.docs), sha256sum)

    def test_host_data_follows_one_stages_image_digest(self):
        for name in STAGES:
            def mutate(docs, name=name):
                c = self.shard(docs, name)
                c["image"] = c["image"].rsplit("@", 1)[0] + "@sha256:" + hashlib.sha256(b"rebuilt").hexdigest()
            self.assertTrue(self.changed(mutate), name)

    def test_host_data_follows_one_stages_argument(self):
        for name in STAGES:
            def mutate(docs, name=name):
                c = self.shard(docs, name)
                c["args"] = c["args"][:-1] + [c["args"][-1] + " --verbose"]
            self.assertTrue(self.changed(mutate), name)
        def drop(docs):
            c = self.shard(docs, "veil-entry")
            c["args"] = [a if a != "--nvml-gpus" else "--supervised" for a in c["args"]]
        self.assertTrue(self.changed(drop))

    def test_host_data_follows_one_stages_environment_variable(self):
        for name in STAGES:
            def mutate(docs, name=name):
                c = self.shard(docs, name)
                if c.get("env"):
                    c["env"][0]["value"] += " --verbose"
                else:
                    c["env"] = [{"name": "RUST_LOG", "value": "debug"}]
            self.assertTrue(self.changed(mutate), name)

    def test_host_data_follows_a_mount(self):
        def mutate(docs):
            self.shard(docs, "veil-stage2")["volumeMounts"][0]["mountPath"] = "/weights"
        self.assertTrue(self.changed(mutate))

    def test_host_data_ignores_the_annotation_and_unpinned_fields(self):
        def mutate(docs):
            sts = statefulset(docs, "veil-stage1")
            sts["spec"]["template"]["metadata"]["annotations"][genpolicy.ANNOTATION] = "anything"
            sts["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
        self.assertFalse(self.changed(mutate))

    def test_make_initdata_prints_one_host_data_that_one_argument_moves(self):
        work = self.tmp / "one-argument"
        shutil.copytree(self.k8s, work)
        before = run(work / "make-initdata.sh", "--overlay", work / "overlays/snp", check=True).stdout
        entry = work / "overlays/snp/entry-hardware.yaml"
        text = entry.read_text()
        self.assertIn('"--nvml-gpus", "--device", "cuda:0",', text)
        entry.write_text(text.replace('"--nvml-gpus", "--device", "cuda:0",', '"--nvml-gpus",'))
        after = run(work / "make-initdata.sh", "--overlay", work / "overlays/snp", check=True).stdout
        self.assertRegex(before, r"^HOST_DATA [0-9a-f]{64}\n$")
        self.assertRegex(after, r"^HOST_DATA [0-9a-f]{64}\n$")
        self.assertNotEqual(before, after)
        docs = render(work / "overlays/snp")
        values = {statefulset(docs, n)["spec"]["template"]["metadata"]["annotations"][genpolicy.ANNOTATION] for n in STAGES}
        self.assertEqual(len(values), 1)
        self.assertEqual(genpolicy.host_data(genpolicy.decode_annotation(values.pop())), after.split()[1])
        self.assertEqual(ck.confidential_problems(docs, self.containerfile, placeholders=False), [])
        shutil.rmtree(work)

    # ---------------------------------------------------------------- placeholders

    def test_placeholder_digests_are_recognised(self):
        for hexpart in ["0" * 64, "1" * 64, "f" * 64, "deadbeef" * 8, "0123456789abcdef" * 4, "01" * 32]:
            self.assertTrue(genpolicy.is_placeholder_digest("sha256:" + hexpart), hexpart)
        for img in ["veil/shard", "veil/host"]:
            self.assertFalse(genpolicy.is_placeholder_digest("sha256:" + hashlib.sha256(img.encode()).hexdigest()))

    def test_committed_placeholders_are_refused_with_release(self):
        committed = render(self.placeholder_copy / "overlays/snp")
        fail, _ = ck.image_problems(committed, release=True)
        self.assertEqual(len([f for f in fail if "placeholder digest" in f]), 6, fail)
        fail, placeholders = ck.image_problems(committed, release=False)
        self.assertEqual(fail, [])
        self.assertTrue(placeholders)
        r = run(self.placeholder_copy / "make-initdata.sh", "--check", "--release")
        self.assertEqual(r.returncode, 1, r.stderr)

    def test_repeated_digit_digest_is_refused(self):
        docs = copy.deepcopy(self.docs)
        c = statefulset(docs, "veil-stage1")["spec"]["template"]["spec"]["containers"][0]
        c["image"] = c["image"].rsplit("@", 1)[0] + "@sha256:" + "7" * 64
        fail, _ = ck.image_problems(docs, release=False)
        self.assertTrue(any("placeholders" in f and "others not" in f for f in fail), fail)
        fail, _ = ck.image_problems(docs, release=True)
        self.assertTrue(any("veil-stage1/shard" in f and "placeholder" in f for f in fail), fail)

    def test_unpinned_images_are_refused(self):
        docs = copy.deepcopy(self.docs)
        statefulset(docs, "veil-entry")["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example.com/veil/shard:0.1.0"
        fail, _ = ck.image_problems(docs, release=False)
        self.assertTrue(any("not pinned by a sha256 digest" in f for f in fail), fail)
        with self.assertRaisesRegex(genpolicy.PolicyError, "not pinned"):
            genpolicy.document(docs, self.containerfile)

    def test_placeholder_images_get_no_policy(self):
        files, placeholders = genpolicy.outputs(render(self.placeholder_copy / "overlays/snp"), self.containerfile)
        self.assertTrue(placeholders)
        self.assertEqual(list(files), ["patch.yaml"])
        self.assertIsNone(genpolicy.decode_annotation(genpolicy.UNSET_ANNOTATION))

    def test_containerfile_and_base_images(self):
        base = (self.placeholder_copy / "base-images.env").read_text()
        self.assertEqual(ck.containerfile_problems(self.containerfile, base, release=False), [])
        self.assertTrue(any("placeholder" in f for f in ck.containerfile_problems(self.containerfile, base, release=True)))
        self.assertEqual(ck.containerfile_problems(self.containerfile, (self.k8s / "base-images.env").read_text(), release=True), [])
        by_tag = self.containerfile.replace("FROM ${RUNTIME_BASE} AS host", "FROM docker.io/library/debian:bookworm-slim AS host")
        self.assertTrue(any("not pinned by digest" in f for f in ck.containerfile_problems(by_tag, base, release=False)))
        tag_default = self.containerfile.replace("ARG RUNTIME_BASE\n", "ARG RUNTIME_BASE=debian:bookworm-slim\n")
        self.assertTrue(any("not a digest" in f for f in ck.containerfile_problems(tag_default, base, release=False)))
        unset = "\n".join(line for line in base.splitlines() if not line.startswith("RUNTIME_BASE="))
        self.assertTrue(any("no value" in f for f in ck.containerfile_problems(self.containerfile, unset, release=False)))
        tagged = base.replace("@sha256:" + "0" * 64, "", 1)
        self.assertTrue(any("not pinned by digest" in f for f in ck.containerfile_problems(self.containerfile, tagged, release=False)))

    # ---------------------------------------------------------------- agent policy

    def policy(self) -> tuple[str, dict]:
        """The one policy (from the annotation every shard pod carries) and its data."""
        sts = statefulset(self.docs, "veil-stage1")
        document = genpolicy.decode_annotation(sts["spec"]["template"]["metadata"]["annotations"][genpolicy.ANNOTATION])
        data = genpolicy.policy_data(genpolicy.confidential_statefulsets(self.docs), genpolicy.containerfile_stages(self.containerfile))
        return tomllib.loads(document)["data"]["policy.rego"], data

    def container(self, data: dict, name: str) -> dict:
        return next(c for c in data["containers"] if c["statefulset"] == name)

    def test_generated_policy_passes_every_check(self):
        self.assertEqual(ck.confidential_problems(self.docs, self.containerfile, placeholders=False), [])

    def test_generated_policy_admits_each_stage_and_refuses_every_mutation(self):
        text, data = self.policy()
        ev = ck.Evaluator(text)
        for name in STAGES:
            req = ck.kata_create_request(self.container(data, name), f"{name}-0", "veil")
            self.assertTrue(ev.allows("CreateContainerRequest", req), name)
            self.assertTrue(ev.allows("CreateContainerRequest", ck.kata_sandbox_request(f"{name}-0", "veil")), name)
            for label, bad in ck.mutations(req):
                self.assertFalse(ev.allows("CreateContainerRequest", bad), (name, label))

    def test_another_stages_container_needs_that_stages_pod_name(self):
        text, data = self.policy()
        ev = ck.Evaluator(text)
        stage2, entry = self.container(data, "veil-stage2"), self.container(data, "veil-entry")
        self.assertFalse(ev.allows("CreateContainerRequest", ck.kata_create_request(stage2, "veil-stage1-0", "veil")))
        self.assertFalse(ev.allows("CreateContainerRequest", ck.kata_create_request(entry, "veil-stage1-0", "veil")))
        # The pod name is the host's choice: a pod it names veil-stage2-7
        # runs stage 2's pinned container wherever the host puts it. That is
        # what one shared policy admits; the shard's attested claims (stage,
        # layer range, manifest root, route) tell peers and clients which
        # stage it serves (deploy/README.md).
        self.assertTrue(ev.allows("CreateContainerRequest", ck.kata_create_request(stage2, "veil-stage2-7", "veil")))
        # One stage's argument vector with another stage's environment is
        # no pinned container, whatever the pod is called.
        mixed = dict(entry, args=self.container(data, "veil-stage1")["args"])
        for pod in ("veil-entry-0", "veil-stage1-0"):
            self.assertFalse(ev.allows("CreateContainerRequest", ck.kata_create_request(mixed, pod, "veil")), pod)

    def test_run_refuses_a_policy_that_mixes_two_stages_values(self):
        text, data = self.policy()
        # Arguments checked against any stage's entry instead of the one the
        # rest of the request matched.
        weak = text.replace("\tp.Args == c.args\n", "\tsome c2 in policy_data.containers\n\tp.Args == c2.args\n")
        self.assertNotEqual(weak, text)
        self.assertEqual(ck.lint_policy(weak), [])
        fail = ck.policy_behaviour_problems(weak, data, "weak")
        self.assertTrue(any("veil-entry/shard with the args of veil-stage1/shard" in f and "admits" in f for f in fail), fail)
        self.assertEqual(ck.policy_behaviour_problems(text, data, "generated"), [])

    def test_check_refuses_a_statefulset_with_its_own_initdata(self):
        docs = copy.deepcopy(self.docs)
        stages = genpolicy.containerfile_stages(self.containerfile)
        # The earlier layout: a document for stage 1's pods alone.
        own = genpolicy.initdata_document(genpolicy.policy_data([statefulset(docs, "veil-stage1")], stages))
        statefulset(docs, "veil-stage1")["spec"]["template"]["metadata"]["annotations"][genpolicy.ANNOTATION] = genpolicy.annotation_value(own)
        fail = ck.confidential_problems(docs, self.containerfile, placeholders=False)
        self.assertTrue(any("2 different initdata annotations" in f for f in fail), fail)
        self.assertTrue(any(f.startswith("snp: veil-stage1: initdata is not what genpolicy.py generates") for f in fail), fail)
        docs = copy.deepcopy(self.docs)
        del statefulset(docs, "veil-stage2")["spec"]["template"]["metadata"]["annotations"][genpolicy.ANNOTATION]
        fail = ck.confidential_problems(docs, self.containerfile, placeholders=False)
        self.assertTrue(any("veil-stage2 has no initdata" in f for f in fail), fail)

    def test_lint_refuses_the_old_hand_written_policy(self):
        fail = ck.lint_policy(OLD_HAND_WRITTEN_POLICY)
        for req in ("CreateContainerRequest", "PullImageRequest", "CreateSandboxRequest"):
            self.assertTrue(any(req in f and "default to false" in f for f in fail), (req, fail))
        _, expected = self.policy()
        behaviour = ck.policy_behaviour_problems(OLD_HAND_WRITTEN_POLICY, expected, "old")
        self.assertTrue(any("image digest" in f for f in behaviour), behaviour)

    def test_lint_refuses_unconditional_and_forbidden_rules(self):
        text, _ = self.policy()
        for extra, needle in [
            ("CreateContainerRequest := true", "unconditionally"),
            ("PullImageRequest if { true }", "unconditionally"),
            ("ExecProcessRequest if { input.process.Args == [\"sh\"] }", "never be admitted"),
            ("default SetPolicyRequest := true", "SetPolicyRequest must default to false"),
            ("AllowRequestsFailingPolicy := true", "never be admitted"),
        ]:
            fail = ck.lint_policy(text + "\n" + extra + "\n")
            self.assertTrue(any(needle in f for f in fail), (extra, fail))

    def test_run_refuses_a_policy_that_pins_the_image_only(self):
        text, expected = self.policy()
        weak = text.replace("\tp.Args == c.args\n", "").replace("\tevery v in env {\n\t\tenv_allowed(c, v, sandbox_name)\n\t}\n", "")
        self.assertNotEqual(weak, text)
        self.assertEqual(ck.lint_policy(weak), [])  # the text alone does not show it...
        fail = ck.policy_behaviour_problems(weak, expected, "weak")  # ...running it does
        self.assertTrue(any("argument" in f for f in fail), fail)
        self.assertTrue(any("environment variable added" in f for f in fail), fail)

    def test_check_refuses_stale_initdata_in_a_render(self):
        docs = copy.deepcopy(self.docs)
        statefulset(docs, "veil-stage1")["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "--hardware"
        fail = ck.confidential_problems(docs, self.containerfile, placeholders=False)
        self.assertTrue(any("veil-entry, veil-stage1, veil-stage2: initdata is not what genpolicy.py generates" in f for f in fail), fail)

    def test_generator_refuses_what_it_cannot_pin(self):
        cases = [
            (lambda c, p: c.update(envFrom=[{"configMapRef": {"name": "x"}}]), "envFrom"),
            (lambda c, p: c["env"].append({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}), "valueFrom"),
            (lambda c, p: c.update(args=["$(VEIL_SERVE_FLAGS)"]), "expansion"),
            (lambda c, p: c["securityContext"].pop("capabilities"), "capabilities"),
            (lambda c, p: p["volumes"].append({"name": "cfg", "configMap": {"name": "x"}}) or c["volumeMounts"].append({"name": "cfg", "mountPath": "/etc/veil"}), "ConfigMap is admitted read-only only"),
            (lambda c, p: p["volumes"].append({"name": "cfg", "secret": {"secretName": "x"}}) or c["volumeMounts"].append({"name": "cfg", "mountPath": "/etc/x", "readOnly": True}), "is a secret"),
            (lambda c, p: p.update(enableServiceLinks=True), "enableServiceLinks"),
        ]
        for mutate, needle in cases:
            docs = copy.deepcopy(self.docs)
            pod = statefulset(docs, "veil-stage1")["spec"]["template"]["spec"]
            mutate(pod["containers"][0], pod)
            with self.assertRaisesRegex(genpolicy.PolicyError, needle):
                genpolicy.document(docs, self.containerfile)

    # ---------------------------------------------------------------- GPUs

    def set_env(self, container: dict, name: str, value: str) -> None:
        env = container.setdefault("env", [])
        for e in env:
            if e["name"] == name:
                e["value"] = value
                return
        env.append({"name": name, "value": value})

    def test_every_gpu_shard_computes_on_its_gpu(self):
        stages = genpolicy.containerfile_stages(self.containerfile)
        self.assertEqual(ck.device_problems(self.docs, stages, "snp"), [])
        for name in STAGES:
            c = self.shard(self.docs, name)
            self.assertEqual(ck.gpu_limit(c), 1, name)
            words = ck.shard_command(c, stages)
            self.assertEqual(words[0], "serve", name)
            self.assertIn("--hardware", words, name)
            self.assertIn("--nvml-gpus", words, name)
            self.assertEqual(words[words.index("--device") + 1], "cuda:0", name)
            self.assertEqual(words[words.index("--gpu-reference") + 1], "/etc/veil/gpu-reference", name)
        device = lambda value: lambda c: c["args"].__setitem__(c["args"].index("--device") + 1, value)
        serve_flags = lambda value: lambda c: self.set_env(c, "VEIL_SERVE_FLAGS", value)
        cases = [
            ("veil-stage1", serve_flags("--hardware --nvml-gpus"), "passes no `--device cuda:N`"),
            ("veil-entry", lambda c: c.update(args=[a for a in c["args"] if a not in ("--device", "cuda:0")]), "passes no `--device cuda:N`"),
            ("veil-stage2", serve_flags("--hardware --device cuda:0"), "does not pass --nvml-gpus"),
            ("veil-entry", lambda c: c.update(args=[a for a in c["args"] if a != "--hardware"]), "does not pass --hardware"),
            ("veil-entry", device("cuda:1"), "the pod has 1 GPU(s)"),
            ("veil-stage1", serve_flags("--hardware --nvml-gpus --device cuda:0 --gpu-reference /etc/other"), "--gpu-reference /etc/other is not a volume mount"),
            ("veil-stage1", serve_flags("--hardware --nvml-gpus --device cpu"), "computes on `cpu`"),
            ("veil-stage2", serve_flags("--hardware --nvml-gpus --device cuda:0 --device cuda:1"), "passes --device 2 times"),
            ("veil-stage1", lambda c: c.update(args=["exec sleep infinity"]), "does not run `veil-shard serve`"),
        ]
        for name, mutate, needle in cases:
            docs = copy.deepcopy(self.docs)
            mutate(self.shard(docs, name))
            fail = ck.device_problems(docs, stages, "snp")
            self.assertTrue(any(f.startswith(f"snp: {name}/shard: ") and needle in f for f in fail), (name, needle, fail))
        # Two GPUs: cuda:1 is the pod's.
        docs = copy.deepcopy(self.docs)
        c = self.shard(docs, "veil-entry")
        c["resources"]["limits"][ck.GPU] = 2
        device("cuda:1")(c)
        self.assertEqual(ck.device_problems(docs, stages, "snp"), [])

    def test_the_cuda_build_finds_the_driver_or_its_stub(self):
        stages = genpolicy.containerfile_stages(self.containerfile)
        dev = render(HERE / "overlays/dev")
        self.assertEqual(ck.cuda_library_problems(dev, stages, "dev"), [])
        self.assertEqual(ck.cuda_library_problems(self.docs, stages, "snp"), [])
        stub = f"{ck.CUDA_LIBS}:{ck.NO_DRIVER}"
        # The Job runs veil-shard without a GPU (both overlays).
        for docs, label in ((self.docs, "snp"), (dev, "dev")):
            docs = copy.deepcopy(docs)
            job = next(d for d in docs if d["kind"] == "Job")
            job["spec"]["template"]["spec"]["containers"][0].pop("env")
            fail = ck.cuda_library_problems(docs, stages, label)
            self.assertTrue(any("Job veil-weights/check" in f and "without a GPU" in f for f in fail), fail)
        # A dev shard without the stub would not start.
        docs = copy.deepcopy(dev)
        c = self.shard(docs, "veil-stage1")
        c["env"] = [e for e in c["env"] if e["name"] != "LD_LIBRARY_PATH"]
        self.assertTrue(any("StatefulSet veil-stage1/shard" in f for f in ck.cuda_library_problems(docs, stages, "dev")))
        # A GPU shard with the stub would never reach the driver.
        docs = copy.deepcopy(self.docs)
        self.set_env(self.shard(docs, "veil-stage2"), "LD_LIBRARY_PATH", stub)
        fail = ck.cuda_library_problems(docs, stages, "snp")
        self.assertTrue(any("veil-stage2/shard: has a GPU yet sets LD_LIBRARY_PATH" in f for f in fail), fail)
        # Containers that do not run veil-shard need nothing (the dev sim-root runs `veil`).
        self.assertFalse(any("sim-root" in f or "weights-ready" in f for f in ck.cuda_library_problems(dev, stages, "dev")))

    def test_policy_pins_the_images_library_path(self):
        _, data = self.policy()
        for c in data["containers"]:
            self.assertIn(f"LD_LIBRARY_PATH={ck.CUDA_LIBS}", c["env"], c["statefulset"])
            self.assertFalse(any(ck.NO_DRIVER in v for v in c["env"]), c["statefulset"])
        other = self.containerfile.replace(f"ENV LD_LIBRARY_PATH={ck.CUDA_LIBS}\n", f"ENV LD_LIBRARY_PATH={ck.CUDA_LIBS}:/models\n")
        self.assertNotEqual(other, self.containerfile)
        self.assertNotEqual(genpolicy.host_data(genpolicy.document(self.docs, other)), self.host_data(self.docs))

    def test_cuda_build_and_library_pins(self):
        libs = (HERE / "cuda-libs.txt").read_text()
        toolchain = ck.TOOLCHAIN.read_text()
        self.assertEqual(ck.cuda_libs_problems(self.containerfile, libs, toolchain), [])
        cpu_only = self.containerfile.replace("veil-enclave/hw,veil-enclave/cuda", "veil-enclave/hw")
        self.assertNotEqual(cpu_only, self.containerfile)
        self.assertTrue(any("veil-enclave/cuda" in f for f in ck.cuda_libs_problems(cpu_only, libs, toolchain)))
        stub_path = self.containerfile.replace(f"ENV LD_LIBRARY_PATH={ck.CUDA_LIBS}\n", f"ENV LD_LIBRARY_PATH={ck.CUDA_LIBS}:{ck.NO_DRIVER}\n")
        self.assertNotEqual(stub_path, self.containerfile)
        self.assertTrue(any("LD_LIBRARY_PATH" in f for f in ck.cuda_libs_problems(stub_path, libs, toolchain)))
        unhashed = "\n".join(line.split(" --hash")[0] if line.startswith("nvidia-curand") else line for line in libs.splitlines())
        self.assertTrue(any("nvidia-curand" in f and "--hash" in f for f in ck.cuda_libs_problems(self.containerfile, unhashed, toolchain)))
        other_runtime = libs.replace("nvidia-cuda-runtime==13.0.96", "nvidia-cuda-runtime==13.1.80")
        self.assertNotEqual(other_runtime, libs)
        self.assertTrue(any("RUNTIME=13.0.96" in f for f in ck.cuda_libs_problems(self.containerfile, other_runtime, toolchain)))
        no_cublas = "\n".join(line for line in libs.splitlines() if not line.startswith("nvidia-cublas"))
        self.assertTrue(any("no nvidia-cublas" in f for f in ck.cuda_libs_problems(self.containerfile, no_cublas, toolchain)))

    # ---------------------------------------------------------------- scripts

    def test_make_initdata_help_prints_usage_and_changes_nothing(self):
        for tree in (self.placeholder_copy, self.k8s):
            before = tree_digest(tree)
            r = run(tree / "make-initdata.sh", "--help")
            self.assertEqual(r.returncode, 0)
            self.assertIn("Usage: deploy/k8s/make-initdata.sh", r.stdout)
            self.assertEqual(tree_digest(tree), before)

    def test_make_initdata_replaces_the_per_stage_layout(self):
        work = self.tmp / "layout"
        shutil.copytree(self.k8s, work)
        initdata = work / "overlays/snp/initdata"
        (initdata / "veil-stage1.toml").write_text("old\n")
        (initdata / "patches.yaml").write_text("old\n")
        r = run(work / "make-initdata.sh", "--overlay", work / "overlays/snp", "--check")
        self.assertEqual(r.returncode, 1)
        self.assertIn("not generated ['patches.yaml', 'veil-stage1.toml']", r.stderr)
        run(work / "make-initdata.sh", "--overlay", work / "overlays/snp", check=True)
        self.assertEqual(sorted(p.name for p in initdata.iterdir()), ["patch.yaml", "shards.toml"])
        self.assertEqual(run(work / "make-initdata.sh", "--overlay", work / "overlays/snp", "--check").returncode, 0)
        shutil.rmtree(work)

    def test_make_initdata_check_fails_on_stale_output(self):
        self.assertEqual(run(self.k8s / "make-initdata.sh", "--overlay", self.k8s / "overlays/snp", "--check").returncode, 0)
        work = self.tmp / "stale"
        shutil.copytree(self.k8s, work)
        hardware = work / "overlays/snp/stages-hardware.yaml"
        text = hardware.read_text()
        self.assertIn('"--hardware --nvml-gpus --device cuda:0 ', text)
        hardware.write_text(text.replace('"--hardware --nvml-gpus --device cuda:0 ', '"--hardware --nvml-gpus '))
        r = run(work / "make-initdata.sh", "--overlay", work / "overlays/snp", "--check")
        self.assertEqual(r.returncode, 1)
        self.assertIn("stale", r.stderr)
        shutil.rmtree(work)

    def test_set_addresses_check_fails_on_stale_route(self):
        work = self.tmp / "addresses"
        shutil.copytree(HERE / "overlays/dev", work)
        self.assertEqual(run(HERE / "set-addresses.py", work, "--check").returncode, 0)
        route = work / "route.toml"
        route.write_text(route.read_text().replace("10.96.0.12:7720", "10.96.200.12:7720"))
        self.assertEqual(run(HERE / "set-addresses.py", work, "--check").returncode, 1)
        self.assertEqual(run(HERE / "set-addresses.py", work, "--service-cidr", "10.43.0.0/16").returncode, 0)
        self.assertEqual(run(HERE / "set-addresses.py", work, "--check").returncode, 0)
        self.assertIn('"10.43.0.12:7720"', route.read_text())
        shutil.rmtree(work)

    def test_route_and_service_mismatches_are_refused(self):
        overlay = HERE / "overlays/snp"
        self.assertEqual(ck.route_problems(self.docs, overlay, "snp"), [])
        cases = [
            (lambda d: d.update(spec={**d["spec"], "clusterIP": "10.96.0.99"}), "veil-stage1-1", "ClusterIP is 10.96.0.99"),
            (lambda d: d.update(spec={**d["spec"], "clusterIP": "10.97.0.13"}), "veil-stage1-1", "ClusterIP is 10.97.0.13"),
            (lambda d: d["spec"].pop("clusterIP"), "veil-stage2-0", "no fixed ClusterIP"),
            (lambda d: d["spec"]["ports"][0].update(port=7799), "veil-stage2-1", "not a port of Service"),
        ]
        for mutate, service, needle in cases:
            docs = copy.deepcopy(self.docs)
            mutate(next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == service))
            fail = ck.route_problems(docs, overlay, "snp")
            self.assertTrue(any(needle in f for f in fail), (service, needle, fail))
        docs = [d for d in copy.deepcopy(self.docs) if d["metadata"]["name"] != "veil-stage2-1"]
        self.assertTrue(any("has no Service veil-stage2-1" in f for f in ck.route_problems(docs, overlay, "snp")))
        docs = copy.deepcopy(self.docs)
        relay = next(d for d in docs if d["kind"] == "Deployment")
        relay["spec"]["template"]["spec"]["containers"][0]["args"][2] = "10.96.200.10:7701"
        self.assertTrue(any("relay's --entry" in f for f in ck.route_problems(docs, overlay, "snp")))

    def test_clusterip_outside_the_static_band_is_refused(self):
        work = self.tmp / "band"
        shutil.copytree(HERE / "overlays/snp", work)
        (work / "addresses.yaml").write_text((work / "addresses.yaml").read_text().replace("--service-cidr 10.96.0.0/12", "--service-cidr 10.96.0.0/24"))
        docs = copy.deepcopy(self.docs)
        for d in docs:
            if d["kind"] == "Service" and d["metadata"]["name"] == "veil-stage2-1":
                d["spec"]["clusterIP"] = "10.96.0.200"
        route = work / "route.toml"
        route.write_text(route.read_text().replace("10.96.0.15:7730", "10.96.0.200:7730"))
        fail = ck.route_problems(docs, work, "snp")
        self.assertTrue(any("static band" in f for f in fail), fail)
        shutil.rmtree(work)

    def test_configmap_reference_without_configmap_is_refused(self):
        dev = render(HERE / "overlays/dev")
        self.assertEqual(ck.configmap_problems(dev, "dev"), [])
        for d in dev:
            if d["kind"] == "ConfigMap":
                d["metadata"]["namespace"] = "default"
        self.assertTrue(any("veil-route" in f for f in ck.configmap_problems(dev, "dev")))


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    failed = len(result.failures) + len(result.errors)
    print(f"k8s: {result.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
