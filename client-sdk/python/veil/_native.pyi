"""Type stubs of the compiled module (src/lib.rs). Use the package ``veil``."""

from typing import List, Optional, Sequence, Tuple

__version__: str

class VeilError(Exception):
    """Any failure of a Veil call. Subclasses say whose fault it is."""

    checks: Optional[str]
    """The check table of a refused route; None for other errors."""

class ConfigError(VeilError):
    """The caller's setup is wrong; the host is not involved."""

class Unreachable(VeilError):
    """The host could not be reached, or the connection dropped before an answer."""

class ProtocolError(VeilError):
    """The host answered outside the protocol."""

class RouteRejected(VeilError):
    """The route failed verification; nothing was sent."""

class AttestationError(RouteRejected):
    """A shard's hardware evidence failed the policy; nothing was sent."""

    who: str

class Refused(VeilError):
    """The host refused the sealed request with an (unauthenticated) HTTP status."""

    status: int

class ApiError(VeilError):
    """The attested entry answered with an error inside the seal."""

    status: int

class Truncated(VeilError):
    """The sealed response did not open to its authenticated end (cut short or altered)."""

class ReceiptError(VeilError):
    """The answer's receipt is missing or fails a check (`check` names it)."""

    check: str

class Timeout(VeilError):
    """The host did not answer within a stage's limit."""

    stage: str

class Route:
    """A verified route."""

    checks: str
    """Every shard's check table and the route's, as `veil verify` prints them."""
    simulated: bool
    """Whether any shard's (or GPU's) evidence is simulated: development only."""
    simulated_shards: int
    warnings: List[str]
    """Every warning a reviewer must see (simulated evidence, unknown fields)."""
    model: str
    verdict: str
    saved: str
    """The route document as verified, with its nonce and time (JSON), for `veil receipt verify`."""
    def to_json(self) -> str:
        """The whole verdict: the document `veil verify --json` prints."""

class Ending:
    """What a response said about itself once read to its authenticated end."""

    route_used: Optional[str]
    drafter_used: Optional[str]
    finish_reason: Optional[str]
    usage: Optional[str]
    receipt: Optional[str]

class NativeResponse:
    status: int
    headers: List[Tuple[str, str]]
    ending: Ending
    def read(self) -> Optional[bytes]: ...
    def close(self) -> None: ...

class NativeTextStream:
    ending: Ending
    def next_text(self) -> Optional[str]: ...
    def close(self) -> None: ...

class NativeClient:
    def __init__(
        self,
        url: str,
        policy: str,
        *,
        policy_key: Optional[str] = None,
        log: Optional[str] = None,
        log_key: Optional[str] = None,
        witnesses: Sequence[str] = (),
        witnesses_required: int = 0,
        unlogged: bool = False,
        ca: Optional[str] = None,
        attest_timeout: float = 30.0,
        first_byte_timeout: float = 300.0,
        between_chunks_timeout: float = 120.0,
        retries: int = 3,
    ) -> None: ...
    def route(self) -> Route: ...
    def call(self, method: str, path: str, body: bytes) -> NativeResponse: ...
    def stream(self, path: str, body: bytes) -> NativeTextStream: ...
