"""The WebAssembly client (client-sdk/wasm, the npm package scripts/build-wasm.sh
builds) in Node, against the same local cluster: node --test runs
client-sdk/wasm/tests/node.test.mjs with the cluster's URL and policies."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, Cluster, binary

PROMPT = "Name three colours of the rainbow."
TOKENS = 24


def package() -> Path:
    pkg = Path(os.environ.get("VEIL_NPM_PACKAGE", REPO / "target" / "npm" / "veil-client"))
    why = None
    if not (pkg / "veil.js").is_file():
        why = f"{pkg} not built (scripts/build-wasm.sh)"
    elif shutil.which("node") is None:
        why = "node is not installed (apt install nodejs)"
    if why:
        if os.environ.get("VEIL_REQUIRE_WASM"):
            pytest.fail(why + " (VEIL_REQUIRE_WASM=1)")
        skipped = Path(os.environ.get("VEIL_BIN_DIR", REPO / "target" / "debug")) / "veil-skipped.txt"
        with open(skipped, "a") as f:
            f.write(f"test_node: {why}\n")
        pytest.skip(why)
    return pkg


def test_the_webassembly_client_in_node(cluster: Cluster, tmp_path: Path) -> None:
    pkg = package()
    other = tmp_path / "other-root"
    subprocess.run([binary("veil"), "attest", "sim-init", str(other)], check=True, capture_output=True)
    expected = subprocess.run(
        [binary("veil"), "chat", cluster.url, "--policy", str(cluster.policy), "--temperature", "0",
         "--max-tokens", str(TOKENS)],
        input=PROMPT + "\n", capture_output=True, text=True, check=True,
    ).stdout.strip()
    env = dict(
        os.environ,
        VEIL_NPM_PACKAGE=str(pkg),
        VEIL_URL=cluster.url,
        VEIL_POLICY=str(cluster.policy),
        VEIL_OTHER_POLICY=str(other / "policy.dev.toml"),
        VEIL_EXPECTED=expected,
        VEIL_PROMPT=PROMPT,
        VEIL_TOKENS=str(TOKENS),
    )
    run = subprocess.run(
        ["node", "--test", "--test-reporter=spec", str(REPO / "client-sdk" / "wasm" / "tests" / "node.test.mjs")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
