"""Veil for Python: verify a private inference route and seal requests to it,
in-process.

Every check runs in the Rust SDK compiled into this package (``veil._native``),
the same code as the ``veil`` command: each shard's hardware attestation
against your policy, the route, the seal (Oblivious HTTP) to the attested
entry, and the opening of each answer. Nothing is sent before the route
verifies, and an answer the host cut short or altered raises ``Truncated``.

    import veil

    route = veil.verify("http://127.0.0.1:8080", policy="policy.toml")
    print(route.checks)

    client = veil.Client("http://127.0.0.1:8080", policy="policy.toml")
    answer = client.chat([{"role": "user", "content": "Hello"}], max_tokens=32)
    print(answer.text)
    for piece in client.stream([{"role": "user", "content": "Hello"}]):
        print(piece, end="", flush=True)
    answer.receipt  # the entry's signed receipt (checked), a dict
    open("route.json", "w").write(client.saved_route())  # for `veil receipt verify`

    openai = veil.openai("http://127.0.0.1:8080", policy="policy.toml")
    openai.chat.completions.create(model=route.model, messages=[...])  # the route's model
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

from . import _native
from ._native import (
    ApiError,
    AttestationError,
    ConfigError,
    ProtocolError,
    ReceiptError,
    Refused,
    Route,
    RouteRejected,
    Timeout,
    Truncated,
    Unreachable,
    VeilError,
)

__all__ = [
    "ApiError",
    "AttestationError",
    "ChatResult",
    "ChatStream",
    "Client",
    "ConfigError",
    "ProtocolError",
    "ReceiptError",
    "Refused",
    "Route",
    "RouteRejected",
    "Timeout",
    "Truncated",
    "Unreachable",
    "VeilError",
    "async_openai",
    "openai",
    "verify",
]

__version__: str = _native.__version__

PathLike = Union[str, "os.PathLike[str]"]
Message = Mapping[str, Any]

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"


def verify(
    url: str,
    policy: PathLike,
    *,
    policy_key: Optional[PathLike] = None,
    log: Optional[str] = None,
    log_key: Optional[PathLike] = None,
    witnesses: Sequence[PathLike] = (),
    witnesses_required: int = 0,
    unlogged: bool = False,
    ca: Optional[PathLike] = None,
    timeout: float = 30.0,
) -> Route:
    """Fetches the route's attestation through the host at ``url`` (a fresh
    nonce) and verifies every shard against ``policy`` (a policy TOML file, or
    a signed bundle with ``policy_key`` that must be in the transparency log
    ``log`` (URL or directory) under ``log_key``, with ``witnesses_required``
    cosignatures of ``witnesses``, unless ``unlogged``). Returns the verified
    route; raises ``RouteRejected`` (``AttestationError`` for a shard's
    evidence) with the failed check table otherwise."""
    return Client(
        url,
        policy,
        policy_key=policy_key,
        log=log,
        log_key=log_key,
        witnesses=witnesses,
        witnesses_required=witnesses_required,
        unlogged=unlogged,
        ca=ca,
        attest_timeout=timeout,
    ).route


class ChatResult:
    """A complete chat answer, opened and authenticated."""

    def __init__(
        self,
        body: Dict[str, Any],
        route_used: Optional[str],
        drafter_used: Optional[str],
        receipt: Optional[str] = None,
    ):
        self.json: Dict[str, Any] = body
        choice = (body.get("choices") or [{}])[0]
        self.text: str = (choice.get("message") or {}).get("content") or ""
        self.finish_reason: Optional[str] = choice.get("finish_reason")
        self.usage: Optional[Dict[str, Any]] = body.get("usage")
        self.route_used = route_used
        self.drafter_used = drafter_used
        # The entry's signed receipt, already checked against the verified
        # route, the sealed request and this answer (``ReceiptError`` if not).
        self.receipt: Optional[Dict[str, Any]] = None if receipt is None else json.loads(receipt)

    def __repr__(self) -> str:
        return f"ChatResult(text={self.text!r}, finish_reason={self.finish_reason!r})"


class ChatStream:
    """A streamed chat answer: iterate for text pieces. It ends only at the
    seal's authenticated end; a stream the host cut or altered raises
    ``Truncated`` instead of ending early, and one whose receipt is missing
    or wrong raises ``ReceiptError``. ``finish_reason``, ``usage``,
    ``route_used``, ``drafter_used`` and ``receipt`` are set once it has ended."""

    def __init__(self, native: "_native.NativeTextStream"):
        self._native = native

    def __iter__(self) -> Iterator[str]:
        while True:
            piece = self._native.next_text()
            if piece is None:
                return
            yield piece

    def close(self) -> None:
        """Stops the answer (the connection closes; the entry cancels it)."""
        self._native.close()

    def __enter__(self) -> "ChatStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def finish_reason(self) -> Optional[str]:
        return self._native.ending.finish_reason

    @property
    def usage(self) -> Optional[Dict[str, Any]]:
        usage = self._native.ending.usage
        return None if usage is None else json.loads(usage)

    @property
    def route_used(self) -> Optional[str]:
        return self._native.ending.route_used

    @property
    def drafter_used(self) -> Optional[str]:
        return self._native.ending.drafter_used

    @property
    def receipt(self) -> Optional[Dict[str, Any]]:
        receipt = self._native.ending.receipt
        return None if receipt is None else json.loads(receipt)


class Client:
    """A verified connection to a Veil host.

    Creating one verifies the route (as ``verify`` does) and raises before
    anything is sent when it fails. Calls are sealed to the attested entry;
    waits release the GIL. A call shed for load (429 or 503, the host's or
    the entry's) is sealed again and re-sent up to ``retries`` times (default
    3; 0 never), after the host's ``Retry-After`` (at most 30 s) and a
    jittered, doubling back-off. When the host refuses a call otherwise or
    the connection fails, the route is verified again and the call re-sent
    only if the entry's attested key changed (a restart).

    ``attest_timeout``, ``first_byte_timeout`` and ``between_chunks_timeout``
    bound each wait in seconds (defaults 30, 300, 120); ``ca`` adds a PEM CA
    file for a host served over https. A signed policy bundle (``policy_key``)
    must be in the transparency log ``log`` (a URL or directory) signed with
    ``log_key``, cosigned by ``witnesses_required`` of ``witnesses``; pass
    ``unlogged=True`` to accept one without a log (no split-view protection).
    """

    def __init__(
        self,
        url: str,
        policy: PathLike,
        *,
        policy_key: Optional[PathLike] = None,
        log: Optional[str] = None,
        log_key: Optional[PathLike] = None,
        witnesses: Sequence[PathLike] = (),
        witnesses_required: int = 0,
        unlogged: bool = False,
        ca: Optional[PathLike] = None,
        attest_timeout: float = 30.0,
        first_byte_timeout: float = 300.0,
        between_chunks_timeout: float = 120.0,
        retries: int = 3,
    ):
        self.url = url.rstrip("/")
        self._native = _native.NativeClient(
            url,
            os.fspath(policy),
            policy_key=None if policy_key is None else os.fspath(policy_key),
            log=None if log is None else os.fspath(log),
            log_key=None if log_key is None else os.fspath(log_key),
            witnesses=[os.fspath(w) for w in witnesses],
            witnesses_required=witnesses_required,
            unlogged=unlogged,
            ca=None if ca is None else os.fspath(ca),
            attest_timeout=attest_timeout,
            first_byte_timeout=first_byte_timeout,
            between_chunks_timeout=between_chunks_timeout,
            retries=retries,
        )
        self.route: Route = self._native.route()

    def chat(self, messages: Sequence[Message], **params: Any) -> ChatResult:
        """``POST /v1/chat/completions`` with ``messages`` and further OpenAI
        parameters (``max_tokens``, ``temperature``, ``seed``, ...). Raises
        ``ApiError`` when the entry refuses a parameter."""
        body = _chat_body(messages, params, stream=False)
        resp = self._native.call("POST", CHAT_COMPLETIONS_PATH, body)
        raw = bytearray()
        while True:
            piece = resp.read()
            if piece is None:
                break
            raw += piece
        if resp.status != 200:
            raise _api_error(resp.status, bytes(raw))
        try:
            answer = json.loads(raw)
        except ValueError as e:
            raise ProtocolError(f"the answer is not JSON: {e}") from None
        return ChatResult(answer, resp.ending.route_used, resp.ending.drafter_used, resp.ending.receipt)

    def stream(self, messages: Sequence[Message], **params: Any) -> ChatStream:
        """``chat`` as a stream of text pieces (see ``ChatStream``)."""
        body = _chat_body(messages, params, stream=True)
        return ChatStream(self._native.stream(CHAT_COMPLETIONS_PATH, body))

    def saved_route(self) -> str:
        """The route document as this client last verified it, with its nonce
        and time (JSON): keep it beside the receipts; ``veil receipt verify
        RECEIPT --route FILE --policy P`` checks them against it offline."""
        return self._native.route().saved

    def __repr__(self) -> str:
        return f"<veil.Client {self.url} {self.route!r}>"


def _chat_body(messages: Sequence[Message], params: Mapping[str, Any], *, stream: bool) -> bytes:
    if "messages" in params or "stream" in params:
        raise ConfigError("give messages as the first argument; chat() and stream() set `stream` themselves")
    body: Dict[str, Any] = dict(params)
    body["messages"] = [dict(m) for m in messages]
    body["stream"] = stream
    try:
        return json.dumps(body).encode()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"the request does not encode as JSON: {e}") from None


def _api_error(status: int, body: bytes) -> ApiError:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:1024].decode("utf-8", "replace")
    err = ApiError(f"{status}: {message}")
    err.status = status
    err.checks = None
    return err


def _httpx(openai_module: Any) -> Any:
    """The HTTP library the installed ``openai`` package is built on:
    ``httpx2`` (openai 3), else ``httpx``; asked of openai's own client class,
    since both may be installed side by side."""
    base = openai_module.DefaultHttpxClient
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)
        if module is not None and issubclass(base, module.Client):
            return module
    import httpx

    return httpx


def _request_path(request: Any) -> str:
    raw = request.url.raw_path
    return raw.decode("ascii") if isinstance(raw, bytes) else str(raw)


_NO_RETRIES = (
    "clients from veil.openai() and veil.async_openai() never retry (max_retries is 0): "
    "an openai retry after a host cut, stalled or refused a call seals and sends the prompt "
    "again and hides Veil's exception. Veil's transport re-sends a call only when the service "
    "shed it for load (429/503, up to the Client's `retries`) or the entry's attested key "
    "changed; retry in your own code where a second send is acceptable"
)


def _refuse_retries(max_retries: Any, *, unset: bool = False) -> None:
    """Raises ``ValueError`` unless ``max_retries`` is 0; with ``unset``, a
    request's own options, a non-number (openai's ``NotGiven``) also passes."""
    if unset and not isinstance(max_retries, (int, float)):
        return
    if max_retries != 0:
        raise ValueError(f"max_retries={max_retries!r}: {_NO_RETRIES}")


def _veil_cause(error: BaseException) -> Optional[VeilError]:
    """The Veil exception an openai ``APIConnectionError`` wraps: openai 1.x
    and 2.x catch every exception of the transport (``raise
    APIConnectionError(...) from err``); openai 3 lets them through."""
    cause = error.__cause__ if error.__cause__ is not None else error.__context__
    return cause if isinstance(cause, VeilError) else None


@functools.lru_cache(maxsize=None)
def _no_retry_class(base: type, connection_error: type) -> type:
    """``base`` (``openai.OpenAI`` or ``openai.AsyncOpenAI``) pinned to
    ``max_retries=0`` everywhere openai reads it (the constructor, ``copy`` /
    ``with_options``, the attribute, a request's own options), and letting
    Veil's exceptions through unwrapped. The overrides are of openai's public
    ``max_retries`` and ``request``, whose shape is the same from 1.40 to 3.x."""
    is_async = inspect.iscoroutinefunction(base.request)

    class NoRetry(base):  # type: ignore[misc,valid-type]
        @property  # type: ignore[override]
        def max_retries(self) -> int:
            return 0

        @max_retries.setter
        def max_retries(self, value: Any) -> None:
            _refuse_retries(value)

    if is_async:

        async def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
            _refuse_retries(getattr(options, "max_retries", None), unset=True)
            try:
                return await super(NoRetry, self).request(cast_to, options, *args, **kwargs)
            except connection_error as e:
                cause = _veil_cause(e)
                if cause is None:
                    raise
            # Outside the handler, so the app gets the transport's exception
            # as it was raised, not chained to openai's wrapper.
            raise cause

    else:

        def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            _refuse_retries(getattr(options, "max_retries", None), unset=True)
            try:
                return super(NoRetry, self).request(cast_to, options, *args, **kwargs)
            except connection_error as e:
                cause = _veil_cause(e)
                if cause is None:
                    raise
            raise cause

    NoRetry.request = request  # type: ignore[attr-defined]
    NoRetry.__name__ = NoRetry.__qualname__ = "Veil" + base.__name__
    NoRetry.__module__ = __name__
    return NoRetry


def openai(url: str, policy: PathLike, *, max_retries: int = 0, **options: Any) -> Any:
    """An ``openai.OpenAI`` client whose HTTP transport verifies the route and
    seals every call in-process (no proxy): every method of the official
    client works, streams included. The route is verified here, before the
    client is returned; ``options`` are ``Client``'s.

    Veil's exceptions (``RouteRejected``, ``Truncated``, ``Timeout``,
    ``Refused``, ...) reach the caller unchanged under every openai version,
    never wrapped in ``openai.APIConnectionError``. The client never retries:
    ``max_retries`` is pinned to 0 and any other value (here, in
    ``with_options`` or set on the client) raises ``ValueError``, since an
    openai retry would seal and send the prompt again to a host that cut,
    stalled or refused it. Veil's transport itself re-sends a call only when
    it was shed for load (429 or 503, up to ``retries`` times, a ``Client``
    option) or the entry's attested key changed (a restart its evidence
    proves)."""
    import openai as openai_module

    _refuse_retries(max_retries)
    httpx = _httpx(openai_module)
    client = Client(url, policy, **options)

    class _Stream(httpx.SyncByteStream):
        def __init__(self, resp: Any):
            self._resp = resp

        def __iter__(self) -> Iterator[bytes]:
            while True:
                piece = self._resp.read()
                if piece is None:
                    return
                yield piece

        def close(self) -> None:
            self._resp.close()

    class _Transport(httpx.BaseTransport):
        def handle_request(self, request: Any) -> Any:
            body = request.read()
            resp = client._native.call(request.method, _request_path(request), body)
            return httpx.Response(resp.status, headers=resp.headers, stream=_Stream(resp), request=request)

    return _no_retry_class(openai_module.OpenAI, openai_module.APIConnectionError)(
        base_url=client.url + "/v1",
        api_key="veil",
        http_client=httpx.Client(transport=_Transport()),
        max_retries=0,
    )


def async_openai(url: str, policy: PathLike, *, max_retries: int = 0, **options: Any) -> Any:
    """``openai`` for asyncio: an ``openai.AsyncOpenAI`` whose transport
    verifies and seals in-process. Each wait runs in a worker thread with the
    GIL released, so the event loop and concurrent requests keep running.
    The route is verified here (a blocking call), before it returns. As with
    ``openai``, Veil's exceptions come through unchanged and ``max_retries``
    is pinned to 0."""
    import anyio.to_thread
    import openai as openai_module

    _refuse_retries(max_retries)
    httpx = _httpx(openai_module)
    client = Client(url, policy, **options)

    class _AsyncStream(httpx.AsyncByteStream):
        def __init__(self, resp: Any):
            self._resp = resp

        async def __aiter__(self) -> Any:
            while True:
                piece = await anyio.to_thread.run_sync(self._resp.read)
                if piece is None:
                    return
                yield piece

        async def aclose(self) -> None:
            self._resp.close()

    class _AsyncTransport(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: Any) -> Any:
            body = await request.aread()
            resp = await anyio.to_thread.run_sync(client._native.call, request.method, _request_path(request), body)
            return httpx.Response(resp.status, headers=resp.headers, stream=_AsyncStream(resp), request=request)

    return _no_retry_class(openai_module.AsyncOpenAI, openai_module.APIConnectionError)(
        base_url=client.url + "/v1",
        api_key="veil",
        http_client=httpx.AsyncClient(transport=_AsyncTransport()),
        max_retries=0,
    )
