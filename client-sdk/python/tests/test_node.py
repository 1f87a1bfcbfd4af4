"""The WebAssembly client (client-sdk/wasm, the npm package scripts/build-wasm.sh
builds) in Node, against the same local cluster: node --test runs
client-sdk/wasm/tests/node.test.mjs with the cluster's URL and policies."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conftest import REPO, Cluster, binary, npm_package, unavailable

PROMPT = "Name three colours of the rainbow."
TOKENS = 24


def package() -> Path:
    pkg = npm_package()
    if not (pkg / "veil.js").is_file():
        unavailable("test_node", f"{pkg} not built (scripts/build-wasm.sh)", "VEIL_REQUIRE_WASM")
    if shutil.which("node") is None:
        unavailable("test_node", "node is not installed (apt install nodejs)", "VEIL_REQUIRE_WASM")
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
