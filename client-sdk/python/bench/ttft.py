"""Time to first token: the official openai client through `veil.openai`
(verify and seal in-process) against the same client through `veil proxy`
(a second process that verifies and seals), on one local three-stage cluster
in the same run, alternating request by request.

    scripts/check-python.sh builds the venv; then
    VEIL_MODEL=... target/python-venv/bin/python client-sdk/python/bench/ttft.py [RUNS]

Uses the binaries in VEIL_BIN_DIR (default target/debug). Prints a table.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import openai  # noqa: E402

import veil  # noqa: E402
from conftest import Cluster, binary, free_port  # noqa: E402

MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


def first_token(client: openai.OpenAI, model: str) -> float:
    started = time.perf_counter()
    stream = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0, stream=True)
    took = None
    for chunk in stream:
        if took is None and chunk.choices and chunk.choices[0].delta.content:
            took = time.perf_counter() - started
    assert took is not None
    return took


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with tempfile.TemporaryDirectory(prefix="veil-bench-") as tmp:
        cluster = Cluster(Path(tmp))
        port = free_port()
        proxy = subprocess.Popen(
            [binary("veil"), "proxy", cluster.url, "--policy", str(cluster.policy), "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            started = time.perf_counter()
            in_process = veil.openai(cluster.url, policy=cluster.policy)
            verify_s = time.perf_counter() - started
            through_proxy = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
            for c in (in_process, through_proxy):  # warm both paths
                first_token(c, cluster.model_id)
            a, b = [], []
            for _ in range(runs):
                a.append(first_token(in_process, cluster.model_id))
                b.append(first_token(through_proxy, cluster.model_id))
        finally:
            proxy.terminate()
            proxy.wait()
            cluster.stop()
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.1f} ms (p10 {sorted(xs)[len(xs) // 10] * 1e3:.1f}, p90 {sorted(xs)[len(xs) * 9 // 10] * 1e3:.1f})"  # noqa: E731
    print(f"time to first token, {runs} streamed requests each, alternating (16 tokens, greedy):")
    print("| client | median TTFT |")
    print("|---|---|")
    print(f"| openai via veil.openai (in-process verify + seal) | {ms(a)} |")
    print(f"| openai via veil proxy (second process) | {ms(b)} |")
    print(f"verifying the 3-stage route in veil.openai(): {verify_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
