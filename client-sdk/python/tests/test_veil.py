"""The Python package against a local three-stage cluster (simulated
attestation): the same answers as the Rust SDK and one local process, and a
typed exception for every way a host can misbehave."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time

import pytest

import veil
from conftest import Cluster, binary
from relay import Relay

PROMPT = "Name three colours of the rainbow."
TOKENS = 24
MESSAGES = [{"role": "user", "content": PROMPT}]


def test_verify_returns_the_route_with_its_checks_and_simulated_flags(cluster: Cluster) -> None:
    route = veil.verify(cluster.url, policy=cluster.policy)
    assert route.simulated and route.simulated_shards >= 4
    assert route.verdict.startswith("ACCEPTED") and "SIMULATED" in route.verdict.upper()
    assert any("simulated" in w.lower() for w in route.warnings)
    assert "== entry" in route.checks and "== route" in route.checks
    doc = json.loads(route.to_json())
    assert doc["accepted"] is True and doc["model"] == route.model
    assert len(doc["shards"]) == route.simulated_shards
    assert all(s["simulated"] for s in doc["shards"])


def test_greedy_answer_equals_the_rust_sdk_and_one_local_process(cluster: Cluster) -> None:
    client = veil.Client(cluster.url, policy=cluster.policy)
    answer = client.chat(MESSAGES, max_tokens=TOKENS, temperature=0)
    rust = subprocess.run(
        [binary("veil"), "chat", cluster.url, "--policy", str(cluster.policy), "--temperature", "0",
         "--max-tokens", str(TOKENS)],
        input=PROMPT + "\n", capture_output=True, text=True, check=True,
    ).stdout.strip()
    local = subprocess.run(
        [binary("veil-shard"), "generate", "--model", cluster.model, "--chat", "--prompt", PROMPT,
         "--max-tokens", str(TOKENS), "--temperature", "0"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert answer.text.strip() == rust == local
    assert answer.finish_reason in ("stop", "length")
    assert answer.usage and answer.usage["completion_tokens"] <= TOKENS
    assert answer.route_used, "the entry reports the route inside the seal"
    streamed = client.stream(MESSAGES, max_tokens=TOKENS, temperature=0)
    assert "".join(streamed) == answer.text
    assert streamed.finish_reason == answer.finish_reason and streamed.route_used


def test_a_seeded_sampled_request_repeats(cluster: Cluster) -> None:
    client = veil.Client(cluster.url, policy=cluster.policy)
    params = dict(max_tokens=TOKENS, temperature=0.9, seed=1234)
    first = client.chat(MESSAGES, **params).text
    assert client.chat(MESSAGES, **params).text == first
    assert "".join(client.stream(MESSAGES, **params)) == first


def test_the_official_openai_client_through_the_in_process_transport(cluster: Cluster) -> None:
    reference = veil.Client(cluster.url, policy=cluster.policy).chat(MESSAGES, max_tokens=TOKENS, temperature=0).text
    client = veil.openai(cluster.url, policy=cluster.policy)
    model = client.models.list().data[0].id
    assert model == cluster.model_id
    done = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=0)
    assert done.choices[0].message.content == reference
    pieces = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == reference


@pytest.mark.parametrize("mode, at", [("truncate", 700), ("tamper", 700), ("tamper", 40)])
def test_a_host_that_cuts_or_alters_the_answer_makes_every_client_raise(
    cluster: Cluster, relay: Relay, mode: str, at: int
) -> None:
    client = veil.Client(relay.url, policy=cluster.policy)
    oa = veil.openai(relay.url, policy=cluster.policy)
    relay.set(mode, at)
    with pytest.raises(veil.Truncated):
        client.chat(MESSAGES, max_tokens=TOKENS, temperature=0)
    with pytest.raises(veil.Truncated):
        list(client.stream(MESSAGES, max_tokens=TOKENS, temperature=0))
    with pytest.raises(veil.Truncated):
        oa.chat.completions.create(model=cluster.model_id, messages=MESSAGES, max_tokens=TOKENS, temperature=0)
    with pytest.raises(veil.Truncated):
        for _ in oa.chat.completions.create(
            model=cluster.model_id, messages=MESSAGES, max_tokens=TOKENS, temperature=0, stream=True
        ):
            pass
    assert len(relay.sealed_requests()) == 4
    # The same relay passing bytes through: the same clients answer.
    relay.set("pass")
    assert client.chat(MESSAGES, max_tokens=4, temperature=0).text
    assert oa.chat.completions.create(model=cluster.model_id, messages=MESSAGES, max_tokens=4).choices[0].message


def test_a_route_under_another_root_is_rejected_before_anything_is_sent(
    cluster: Cluster, relay: Relay, tmp_path
) -> None:
    other = tmp_path / "other-root"
    subprocess.run([binary("veil"), "attest", "sim-init", str(other)], check=True, capture_output=True)
    policy = other / "policy.dev.toml"
    assert policy.is_file()
    with pytest.raises(veil.RouteRejected) as refused:
        veil.Client(relay.url, policy=policy)
    assert isinstance(refused.value, veil.AttestationError)
    assert refused.value.checks and "FAIL" in refused.value.checks
    with pytest.raises(veil.RouteRejected):
        veil.openai(relay.url, policy=policy)
    assert relay.requests, "the relay saw the attestation requests"
    assert relay.sealed_requests() == []


def test_async_openai_streams_two_requests_concurrently(cluster: Cluster) -> None:
    client = veil.async_openai(cluster.url, policy=cluster.policy)

    async def one(prompt: str) -> list:
        arrivals = []
        stream = await client.chat.completions.create(
            model=cluster.model_id, messages=[{"role": "user", "content": prompt}], max_tokens=32, temperature=0, stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.monotonic(), chunk.choices[0].delta.content))
        return arrivals

    async def both() -> tuple:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        a, b = await asyncio.gather(one("Tell me about the sea."), one("Tell me about mountains."))
        done.set()
        await t
        return a, b, ticks

    a, b, ticks = asyncio.run(both())
    assert a and b
    # Interleaved: each stream's first piece came before the other's last.
    assert a[0][0] < b[-1][0] and b[0][0] < a[-1][0]
    # The event loop kept running while both waited.
    assert ticks > 10


def test_waits_release_the_gil(cluster: Cluster) -> None:
    client = veil.Client(cluster.url, policy=cluster.policy)
    count = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal count
        while not stop.is_set():
            count += 1

    t = threading.Thread(target=spin)
    t.start()
    # The spinning thread's rate with nothing else in the process...
    before, started = count, time.monotonic()
    time.sleep(0.3)
    alone = (count - before) / (time.monotonic() - started)
    # ... and while this thread waits for an answer.
    before, started = count, time.monotonic()
    client.chat(MESSAGES, max_tokens=TOKENS, temperature=0)
    during = (count - before) / (time.monotonic() - started)
    stop.set()
    t.join()
    # A native wait that held the GIL leaves the spinning thread only the
    # moments between calls: about 1% of its rate here, against 50-100%.
    assert during > 0.2 * alone, (during, alone)


def test_bad_input_and_unreachable_hosts_get_typed_errors(cluster: Cluster, relay: Relay) -> None:
    client = veil.Client(cluster.url, policy=cluster.policy)
    with pytest.raises(veil.ApiError) as bad:
        client.chat(MESSAGES, max_tokens=100_000)
    assert bad.value.status == 400
    with pytest.raises(veil.ConfigError):
        client.chat(MESSAGES, stream=True)
    with pytest.raises(veil.ConfigError):
        veil.Client(cluster.url, policy=cluster.root / "missing.toml")
    port = relay.server.server_address[1]
    relay.close()
    with pytest.raises(veil.Unreachable):
        veil.Client(f"http://127.0.0.1:{port}", policy=cluster.policy, attest_timeout=5)
    # The cluster still serves after all of that.
    assert client.chat(MESSAGES, max_tokens=4, temperature=0).text


def test_a_stalling_host_times_out(cluster: Cluster, relay: Relay) -> None:
    client = veil.Client(relay.url, policy=cluster.policy, first_byte_timeout=1)
    relay.set("stall", 3)
    with pytest.raises(veil.Timeout) as late:
        client.chat(MESSAGES, max_tokens=4)
    assert "first byte" in late.value.stage
