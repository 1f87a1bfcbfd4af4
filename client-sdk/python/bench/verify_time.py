"""Time to verify a three-stage route (four simulated shards): in the
browser (the `veil web` page in headless Chromium: the WebAssembly
verifier, its clock and Web Crypto nonce, the attestation fetched through
`veil web`), against the Rust CLI (`veil verify`, a process per run) and the
Python package (`veil.verify`, in-process), on one local cluster in the same
run, alternating run by run. Each does the same work: fetch the document
for a fresh nonce, then every shard's and the route's checks.

    scripts/check-python.sh builds the venv and scripts/build-wasm.sh the
    package; then
    VEIL_MODEL=... target/python-venv/bin/python client-sdk/python/bench/verify_time.py [RUNS] [--cli PATH]

The page's time excludes compiling the WebAssembly module (shown apart).
`--cli` picks the `veil` binary timed as the CLI (default: VEIL_BIN_DIR's,
which also serves the page and runs the cluster). Prints a table.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

import veil  # noqa: E402
from conftest import Cluster, binary  # noqa: E402
from test_browser import Web, package  # noqa: E402


def main() -> None:
    args = sys.argv[1:]
    cli = binary("veil")
    if "--cli" in args:
        i = args.index("--cli")
        cli = args[i + 1]
        del args[i : i + 2]
    runs = int(args[0]) if args else 20
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    with tempfile.TemporaryDirectory(prefix="veil-bench-") as tmp:
        cluster = Cluster(Path(tmp))
        web = Web(cluster.url, cluster.policy, Path(tmp) / "web.log")
        browser = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
        page_ms, load_ms, fetch_ms, cli_ms, py_ms = [], [], [], [], []
        try:
            for _ in range(runs + 1):  # the first round warms every path and is not counted
                browser.get(web.url + "/")
                deadline = time.monotonic() + 120
                while (state := browser.execute_script("return document.body.dataset.state")) not in (
                    "verified", "refused"
                ):
                    if time.monotonic() > deadline:
                        raise SystemExit("the page did not verify")
                    time.sleep(0.01)
                if state != "verified":
                    raise SystemExit(f"the page refused the route: {browser.execute_script('return window.veilPage')}")
                shown = browser.execute_script("return window.veilPage")
                page_ms.append(shown["verifyMs"])
                load_ms.append(shown["loadMs"])
                fetch_ms.append(browser.execute_script(
                    "return performance.getEntriesByType('resource')"
                    ".filter(e => e.name.includes('/v1/attestation')).map(e => e.duration)[0]"
                ))

                started = time.perf_counter()
                subprocess.run([cli, "verify", cluster.url, "--policy", str(cluster.policy)],
                               check=True, capture_output=True)
                cli_ms.append((time.perf_counter() - started) * 1000)

                started = time.perf_counter()
                veil.verify(cluster.url, policy=cluster.policy)
                py_ms.append((time.perf_counter() - started) * 1000)
        finally:
            browser.quit()
            web.stop()
            cluster.stop()
    rows = [
        ("browser: veil web page (wasm verifier)", page_ms[1:]),
        ("  of which: the attestation fetched through veil web", fetch_ms[1:]),
        ("  not counted: compiling the wasm module", load_ms[1:]),
        (f"Rust CLI: veil verify ({Path(cli).parent.name} build, process per run)", cli_ms[1:]),
        ("Python: veil.verify (in-process)", py_ms[1:]),
    ]
    print(f"verify a 3-stage route (4 shards, simulated), {runs} runs each, package {package()}")
    print(f"{'client':<58} {'median ms':>10} {'p90 ms':>8}")
    for name, values in rows:
        values = sorted(values)
        p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
        print(f"{name:<58} {statistics.median(values):>10.1f} {p90:>8.1f}")


if __name__ == "__main__":
    main()
