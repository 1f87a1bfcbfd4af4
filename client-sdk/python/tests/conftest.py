"""A local three-stage cluster (simulated attestation) for the Python tests:
the repository's debug binaries (VEIL_BIN_DIR, default target/debug) and the
reference model (VEIL_MODEL, from scripts/fetch-model.sh)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from relay import Relay

REPO = Path(__file__).resolve().parents[3]


def binary(name: str) -> str:
    path = Path(os.environ.get("VEIL_BIN_DIR", REPO / "target" / "debug")) / name
    if not path.is_file():
        pytest.fail(f"{path} missing: build the workspace first (cargo build --workspace)")
    return str(path)


# The question the examples in the book and the package README ask, and how they ask it.
README_QUESTION = "What is the capital of France? Answer in one sentence."


def readme_answer_locally(model: str) -> str:
    """That question answered by one local process (`veil-shard
    generate`), greedily with the 1.1 repetition penalty and 32 tokens, as
    the examples ask it through a route."""
    return subprocess.run(
        [binary("veil-shard"), "generate", "--model", model, "--chat", "--prompt", README_QUESTION,
         "--max-tokens", "32", "--temperature", "0", "--repeat-penalty", "1.1"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()


def npm_package() -> Path:
    """The WebAssembly client's npm package (scripts/build-wasm.sh)."""
    return Path(os.environ.get("VEIL_NPM_PACKAGE", REPO / "target" / "npm" / "veil-client"))


def unavailable(test: str, why: str, require: str) -> None:
    """A test's input is missing: fails under the environment variable
    `require`, else records the skip among the skipped checks and skips."""
    if os.environ.get(require):
        pytest.fail(f"{why} ({require}=1)")
    skipped = Path(os.environ.get("VEIL_BIN_DIR", REPO / "target" / "debug")) / "veil-skipped.txt"
    with open(skipped, "a") as f:
        f.write(f"{test}: {why}\n")
    pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path):
        self.model = os.environ.get("VEIL_MODEL")
        if not self.model:
            pytest.fail("VEIL_MODEL is not set (scripts/fetch-model.sh prints the path)")
        ports = [free_port() for _ in range(7)]
        self.url = f"http://127.0.0.1:{ports[0]}"
        self.root = root
        config = root / "cluster.toml"
        config.write_text(
            f"""
model = "{self.model}"
policy = "{root}/sim/policy.dev.toml"
simulated_root = "{root}/sim"
simulated_gpus = 1
kv_budget_mib = 256
prefill_chunk = 64
heartbeat_ms = 250

[speculation]
drafter = "ngram"
k_max = 8

[entry]
generate_listen = "127.0.0.1:{ports[1]}"
sealed_listen = "127.0.0.1:{ports[2]}"

[[stage]]
layers = [0, 10]
replicas = ["127.0.0.1:{ports[3]}"]

[[stage]]
layers = [10, 20]
replicas = ["127.0.0.1:{ports[4]}", "127.0.0.1:{ports[5]}"]

[[stage]]
layers = [20, 30]
replicas = ["127.0.0.1:{ports[6]}"]
"""
        )
        self.out = open(root / "cluster.out", "w+")
        self.log = open(root / "cluster.log", "w")
        self.process = subprocess.Popen(
            [binary("veil-host"), "cluster", "--config", str(config), "--model", self.model,
             "--listen", f"127.0.0.1:{ports[0]}"],
            stdout=self.out, stderr=self.log,
        )
        deadline = time.monotonic() + 300
        while "listening on" not in (root / "cluster.out").read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("the cluster did not come up:\n" + (root / "cluster.log").read_text()[-4000:])
            time.sleep(0.25)
        self.policy = root / "policy.toml"
        subprocess.run(
            [binary("veil"), "policy", "init", self.url, "--out", str(self.policy), "--allow-simulated", "--force"],
            check=True, capture_output=True,
        )
        # The model's name as the route serves it (the OpenAI `model` field).
        verdict = subprocess.run(
            [binary("veil"), "verify", self.url, "--policy", str(self.policy), "--json"],
            check=True, capture_output=True, text=True,
        ).stdout
        self.model_id: str = json.loads(verdict)["model"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.out.close()
        self.log.close()


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="veil-py-") as tmp:
        c = Cluster(Path(tmp))
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture()
def relay(cluster: Cluster) -> Iterator[Relay]:
    r = Relay(cluster.url)
    try:
        yield r
    finally:
        r.close()
