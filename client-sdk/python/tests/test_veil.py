"""The Python package against a local three-stage cluster (simulated
attestation): the same answers as the Rust SDK and one local process, and a
typed exception for every way a host can misbehave."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time

import openai
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


def test_the_readme_example_runs_as_written(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """The package README's example, with only the demo's URL and policy
    path replaced by this cluster's: it verifies, answers greedily with the
    repetition penalty as one local process does, and names the served model."""
    import re

    from conftest import REPO, readme_answer_locally

    text = (REPO / "client-sdk" / "python" / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert '"http://127.0.0.1:8080"' in code and '"target/veil-local/policy.toml"' in code
    code = code.replace('"http://127.0.0.1:8080"', repr(cluster.url))
    code = code.replace('"target/veil-local/policy.toml"', repr(str(cluster.policy)))
    exec(compile(code, "client-sdk/python/README.md", "exec"), {})
    out = capsys.readouterr().out
    local = readme_answer_locally(cluster.model)
    lines = out.splitlines()
    assert lines[0].startswith("ACCEPTED") and "SIMULATED" in lines[0].upper(), out
    assert local and local in out, f"{local!r} not in:\n{out}"
    assert "Paris" in local, local


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


def test_the_openai_surface_through_veil_openai(cluster: Cluster) -> None:
    """Log-probabilities, seeded choices and structured outputs
    with the official client over the in-process sealed transport; tools on
    a model whose template has no tool section are a 400 naming them."""
    client = veil.openai(cluster.url, policy=cluster.policy)
    model = client.models.list().data[0].id
    done = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=0, logprobs=True, top_logprobs=3
    )
    content = done.choices[0].logprobs.content
    assert "".join(t.token for t in content) == done.choices[0].message.content
    for t in content:
        # Greedy: the chosen token is the most likely, listed first.
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6
    seeded = dict(model=model, messages=MESSAGES, max_tokens=TOKENS, temperature=1.0, seed=7, n=3)
    a = client.chat.completions.create(**seeded)
    b = client.chat.completions.create(**seeded)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    structured = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name a city."}],
        max_tokens=48,
        temperature=0.8,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": schema}},
    )
    answer = json.loads(structured.choices[0].message.content)
    assert set(answer) == {"city", "population"} and isinstance(answer["population"], int)
    assert isinstance(answer["city"], str) and len(answer["city"]) <= 20
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, tools=[tool])
    assert "no tool section" in str(e.value)


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


def receipt_verify(receipts: object, route: object, policy: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary("veil"), "receipt", "verify", str(receipts), "--route", str(route), "--policy", str(policy)],
        capture_output=True, text=True, timeout=120,
    )


def test_receipts_verify_offline_and_an_edit_fails_on_the_check_it_touches(cluster: Cluster, tmp_path) -> None:
    client = veil.Client(cluster.url, policy=cluster.policy)
    answer = client.chat(MESSAGES, max_tokens=8, temperature=0)
    receipt = answer.receipt
    assert receipt and answer.usage, "a completed answer carries the entry's checked receipt"
    assert receipt["completion_tokens"] == answer.usage["completion_tokens"]
    assert receipt["prompt_tokens"] == answer.usage["prompt_tokens"]
    assert receipt["shards"] == answer.route_used and receipt["drafter"] == answer.drafter_used
    streamed = client.stream(MESSAGES, max_tokens=8, temperature=0)
    assert "".join(streamed) == answer.text
    assert streamed.receipt and streamed.receipt["id"] != receipt["id"]
    assert streamed.receipt["route"] == receipt["route"] and streamed.receipt["request"] != receipt["request"]

    route = tmp_path / "route.json"
    route.write_text(client.saved_route())
    saved = tmp_path / "receipt.json"
    saved.write_text(json.dumps(receipt))
    ok = receipt_verify(saved, route, cluster.policy)
    assert ok.returncode == 0 and "ACCEPTED: 1 of 1 receipt(s)" in ok.stdout, ok.stdout + ok.stderr

    def flip(hex_digits: str) -> str:
        return ("1" if hex_digits[0] == "0" else "0") + hex_digits[1:]

    edits = [
        ("completion_tokens", receipt["completion_tokens"] + 1, "signature"),
        ("prompt_tokens", 0, "signature"),
        ("drafter", "none", "signature"),
        ("request", flip(receipt["request"]), "signature"),
        ("route", flip(receipt["route"]), "route"),
        ("model", flip(receipt["model"]), "model"),
        ("key", flip(receipt["key"]), "key"),
        ("time", 1, "time"),
        ("version", 2, "format"),
    ]
    for field, value, check in edits:
        edited = dict(receipt, **{field: value})
        saved.write_text(json.dumps(edited))
        bad = receipt_verify(saved, route, cluster.policy)
        assert bad.returncode == 1 and f"check `{check}` failed" in bad.stdout, (field, bad.stdout + bad.stderr)
    saved.write_text(json.dumps(receipt))

    # The route document edited (another nonce than the one the evidence binds).
    doc = json.loads(client.saved_route())
    doc["nonce"] = flip(doc["nonce"])
    other = tmp_path / "other-route.json"
    other.write_text(json.dumps(doc))
    bad = receipt_verify(saved, other, cluster.policy)
    assert bad.returncode == 1 and "check `route_document` failed" in bad.stdout, bad.stdout
    # Another policy: one pinning another layer count refuses the route.
    other_policy = tmp_path / "other-policy.toml"
    other_policy.write_text(cluster.policy.read_text())
    subprocess.run([binary("veil"), "policy", "set-layers", str(other_policy), "31"], check=True, capture_output=True)
    bad = receipt_verify(saved, route, other_policy)
    assert bad.returncode == 1 and "check `route_document` failed" in bad.stdout, bad.stdout
    assert "route_shape" in bad.stdout, bad.stdout
    # Unreadable input is exit 2, not a verdict.
    assert receipt_verify(tmp_path / "missing.json", route, cluster.policy).returncode == 2


def test_veil_proxy_appends_routes_and_receipts_that_verify(cluster: Cluster, tmp_path) -> None:
    import urllib.request

    from conftest import free_port

    log = tmp_path / "receipts.jsonl"
    port = free_port()
    proxy = subprocess.Popen(
        [binary("veil"), "proxy", cluster.url, "--policy", str(cluster.policy), "--listen", f"127.0.0.1:{port}",
         "--receipts", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proxy.stdout is not None
        assert "listening on" in proxy.stdout.readline()
        for stream in (False, True):
            body = json.dumps({"model": cluster.model_id, "messages": MESSAGES, "max_tokens": 6, "temperature": 0,
                               "stream": stream}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                assert resp.status == 200
                resp.read()
        deadline = time.monotonic() + 10
        while log.read_text().count('"receipt"') < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [next(iter(line)) for line in lines] == ["route", "receipt", "receipt"], lines
    ok = receipt_verify(log, log, cluster.policy)
    assert ok.returncode == 0 and "ACCEPTED: 2 of 2 receipt(s)" in ok.stdout, ok.stdout + ok.stderr


def test_a_signed_policy_must_be_in_the_transparency_log(cluster: Cluster, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VEIL_STATE_DIR", str(tmp_path / "state"))

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([binary("veil"), *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done

    run("log", "init", str(tmp_path / "log"), "--origin", "policy.example.org/log")
    run("policy", "keygen", "--out", str(tmp_path / "publisher.key"))
    bundle = tmp_path / "policy.v1.json"
    run("policy", "sign", str(cluster.policy), "--key", str(tmp_path / "publisher.key"), "--version", "1",
        "--out", str(bundle), "--log", str(tmp_path / "log"))
    key = tmp_path / "publisher.pub"
    # Without a log the bundle is refused before anything is fetched; with one it verifies.
    with pytest.raises(veil.ConfigError, match="must be in a transparency log"):
        veil.verify(cluster.url, bundle, policy_key=key)
    route = veil.verify(cluster.url, bundle, policy_key=key, log=str(tmp_path / "log"),
                        log_key=tmp_path / "log" / "log.vkey")
    assert route.verdict.startswith("ACCEPTED"), route.verdict
    # Two witnesses required, none cosigned: refused.
    for w in ("w1", "w2"):
        run("log", "keygen", "--name", f"{w}.example", "--out", str(tmp_path / w))
    with pytest.raises(veil.ConfigError, match="0 of the 2 required witness cosignatures"):
        veil.verify(cluster.url, bundle, policy_key=key, log=str(tmp_path / "log"),
                    log_key=tmp_path / "log" / "log.vkey",
                    witnesses=[tmp_path / "w1.vkey", tmp_path / "w2.vkey"], witnesses_required=2)
