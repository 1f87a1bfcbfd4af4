"""The WebAssembly client (client-sdk/wasm, the npm package scripts/build-wasm.sh
builds) in Node, against the same local cluster: node --test runs
client-sdk/wasm/tests/node.test.mjs with the cluster's URL and policies."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conftest import REPO, Cluster, binary, npm_package, readme_answer_locally, unavailable

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


def test_the_readme_node_example_runs_as_an_app_installs_it(cluster: Cluster, tmp_path: Path) -> None:
    """The book's Node example (docs/apps.md), run as written from an app directory into
    which the package is installed as `npm install PATH` lays it out (npm when
    present, else the same copy under node_modules/): imported by name, the
    .wasm loaded by the package itself, the greedy answer with the repetition
    penalty equal to one local process's. A module that fails to load is a
    VeilError of kind config, and a later load succeeds."""
    import re

    pkg = package()
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "version": "1.0.0", "type": "module"}\n')
    if shutil.which("npm"):
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--offline", str(pkg)], cwd=app,
                       check=True, capture_output=True, timeout=120)
    else:
        shutil.copytree(pkg, app / "node_modules" / "veil-client")
    readme = (REPO / "docs" / "apps.md").read_text()
    code = re.search(r"```js\n(// app\.mjs.*?)```", readme, re.S).group(1)
    assert '"http://127.0.0.1:8080"' in code and '"target/veil-local/policy.toml"' in code
    code = code.replace('"http://127.0.0.1:8080"', f'"{cluster.url}"')
    code = code.replace('"target/veil-local/policy.toml"', f'"{cluster.policy}"')
    (app / "app.mjs").write_text(code)
    run = subprocess.run(["node", "app.mjs"], cwd=app, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    local = readme_answer_locally(cluster.model)
    lines = run.stdout.splitlines()
    assert lines[0].startswith("ACCEPTED") and "SIMULATED" in lines[0], run.stdout
    assert local and run.stdout.strip().endswith(local), f"{local!r} vs\n{run.stdout}"
    # The .wasm is exported for bundlers, and a bad module is a typed error.
    (app / "load.mjs").write_text(
        'import { createRequire } from "node:module";\n'
        'import { load, Veil } from "veil-client";\n'
        'const require = createRequire(import.meta.url);\n'
        'console.log(require.resolve("veil-client/veil_wasm_bg.wasm").endsWith("veil_wasm_bg.wasm"));\n'
        'try { await load(new Uint8Array([0, 1, 2, 3])); console.log("loaded?"); }\n'
        'catch (e) { console.log(e.name, e.kind); }\n'
        'await load();\n'
        'try { await Veil.verify("ftp://x", ""); } catch (e) { console.log(e.name, e.kind); }\n'
    )
    run = subprocess.run(["node", "load.mjs"], cwd=app, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == ["true", "VeilError config", "VeilError config"], run.stdout + run.stderr
