"""``veil.openai()`` and ``veil.async_openai()`` against a hostile host:
whatever openai version is installed (scripts/check-python.sh runs this file
under the pinned one and again under openai 1.40.0, the lowest the package
allows), a host that cuts, stalls, refuses or drops a call gets the sealed
prompt once, and the app sees Veil's exception, not openai's wrapper.

openai 1.x and 2.x catch every exception of the transport, retry it twice by
default and then raise ``openai.APIConnectionError``: without the pin and the
unwrapping these tests count three sealed requests there.

The one status Veil itself re-sends on is load shedding (429, 503): those
cases here set ``retries=0`` to count openai's sends alone, and
``test_a_call_shed_for_load_is_sealed_again_up_to_retries`` counts Veil's."""

from __future__ import annotations

import asyncio
from typing import Any, Dict

import openai
import pytest

import veil
from conftest import Cluster
from relay import Relay

MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]

# (relay mode, its argument, what the app must see, Client options)
HOSTILE = [
    ("truncate", 700, veil.Truncated, {}),
    ("stall", 3, veil.Timeout, {"first_byte_timeout": 1}),
    ("refuse", 503, veil.Refused, {"retries": 0}),
    ("refuse", 409, veil.Refused, {}),  # a status that makes Veil verify the route again
    ("drop", 0, veil.Unreachable, {}),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    "mode, at, error, options", HOSTILE, ids=[f"{m}-{a}" for m, a, _, _ in HOSTILE]
)
def test_a_hostile_host_gets_one_sealed_request_and_the_app_gets_veils_exception(
    cluster: Cluster, relay: Relay, mode: str, at: int, error: type, options: Dict[str, Any], stream: bool
) -> None:
    params = dict(model=cluster.model_id, messages=MESSAGES, max_tokens=16, temperature=0, stream=stream)
    sync = veil.openai(relay.url, policy=cluster.policy, **options)
    relay.set(mode, at)
    with pytest.raises(error) as raised:
        answer = sync.chat.completions.create(**params)
        if stream:
            list(answer)
    assert type(raised.value) is error, raised.value
    assert len(relay.sealed_requests()) == 1, (openai.__version__, relay.sealed_requests())

    async_client = veil.async_openai(relay.url, policy=cluster.policy, **options)

    async def call() -> None:
        answer = await async_client.chat.completions.create(**params)
        if stream:
            async for _ in answer:
                pass

    relay.set(mode, at)
    with pytest.raises(error) as raised:
        asyncio.run(call())
    assert type(raised.value) is error, raised.value
    assert len(relay.sealed_requests()) == 1, (openai.__version__, relay.sealed_requests())


@pytest.mark.parametrize("status", [503, 429])
def test_a_call_shed_for_load_is_sealed_again_up_to_retries(cluster: Cluster, relay: Relay, status: int) -> None:
    """A host that sheds every call (no Retry-After: the SDK's own back-off)
    gets 1 + ``retries`` sealed requests, each sealed anew, and the app
    ``Refused`` with the status; openai adds none."""
    params = dict(model=cluster.model_id, messages=MESSAGES, max_tokens=16, temperature=0)
    client = veil.openai(relay.url, policy=cluster.policy, retries=2)
    relay.set("refuse", status)
    with pytest.raises(veil.Refused) as raised:
        client.chat.completions.create(**params)
    assert str(status) in str(raised.value)
    sent = relay.sealed_requests()
    assert len(sent) == 3, (openai.__version__, sent)


def test_a_cut_model_listing_is_sent_once(cluster: Cluster, relay: Relay) -> None:
    """A GET (sealed too) goes through openai's paginated path."""
    client = veil.openai(relay.url, policy=cluster.policy)
    relay.set("truncate", 40)
    with pytest.raises(veil.Truncated):
        client.models.list()
    assert len(relay.sealed_requests()) == 1


def test_retries_are_pinned_to_zero_and_a_caller_cannot_turn_them_on(cluster: Cluster) -> None:
    for make in (veil.openai, veil.async_openai):
        # Refused before the route is even fetched.
        with pytest.raises(ValueError, match="never retry"):
            make(cluster.url, policy=cluster.policy, max_retries=2)
        client = make(cluster.url, policy=cluster.policy, max_retries=0)
        assert isinstance(client, openai.OpenAI if make is veil.openai else openai.AsyncOpenAI)
        assert client.max_retries == 0
        with pytest.raises(ValueError, match="never retry"):
            client.with_options(max_retries=1)
        with pytest.raises(ValueError, match="never retry"):
            client.max_retries = 3
        assert client.max_retries == 0
        copied = client.with_options(timeout=30)
        assert copied.max_retries == 0 and type(copied) is type(client)
    # A request's own options: refused before anything is sealed.
    client = veil.openai(cluster.url, policy=cluster.policy)
    with pytest.raises(ValueError, match="never retry"):
        client.get("/models", cast_to=object, options={"max_retries": 2})
