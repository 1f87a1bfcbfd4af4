"""A hostile relay for the tests: it stands between the Python client and the
Veil host, forwards every request, records what passed, and in the mode the
test sets cuts, alters or stalls the sealed responses. The host's own relay
can do all of this; the client must notice each."""

from __future__ import annotations

import http.client
import re
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional, Tuple
from urllib.parse import urlsplit

SEALED_PATH = "/v1/sealed"


class Relay:
    """Modes: ``pass``; ``truncate`` (a sealed response ends cleanly after
    ``at`` bytes); ``tamper`` (the byte at offset ``at`` of a sealed response
    is flipped); ``stall`` (a sealed request gets no answer for ``at``
    seconds); ``refuse`` (a sealed request is answered with the HTTP status
    ``at``, not forwarded); ``drop`` (a sealed request's connection is closed
    with no answer, not forwarded); ``replay`` (an attestation request is
    forwarded with a nonce the relay chose, so the answer is evidence made
    for another request, as a replayed document is); ``flood`` (an
    attestation request is answered with ``at`` MiB of junk)."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.mode = "pass"
        self.at = 0
        self.requests: List[Tuple[str, str]] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                relay._forward(self)

            def do_POST(self) -> None:
                relay._forward(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, mode: str, at: float = 0) -> None:
        self.mode, self.at = mode, at
        self.requests.clear()

    def sealed_requests(self) -> List[Tuple[str, str]]:
        return [r for r in self.requests if r[0] == "POST" and r[1].startswith(SEALED_PATH)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _forward(self, h: BaseHTTPRequestHandler) -> None:
        self.requests.append((h.command, h.path))
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        sealed = h.command == "POST" and h.path.startswith(SEALED_PATH)
        path = h.path
        if self.mode == "replay" and h.command == "GET" and path.startswith("/v1/attestation"):
            path = re.sub(r"nonce=[0-9a-fA-F]*", "nonce=" + secrets.token_hex(32), path)
        if self.mode == "flood" and h.command == "GET" and path.startswith("/v1/attestation"):
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            try:
                for _ in range(int(self.at) * 16):
                    self._chunk(h, b"{" * 65536)
                h.wfile.write(b"0\r\n\r\n")
                h.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        if sealed and self.mode == "stall":
            time.sleep(self.at)
        if sealed and self.mode == "refuse":
            h.send_response(int(self.at))
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", "7")
            h.end_headers()
            h.wfile.write(b"refused")
            h.wfile.flush()
            return
        if sealed and self.mode == "drop":
            h.close_connection = True
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=600)
        headers = {k: v for k, v in h.headers.items() if k.lower() in ("content-type", "content-length")}
        conn.request(h.command, path, body=body, headers=headers)
        resp = conn.getresponse()
        h.send_response(resp.status)
        if resp.getheader("Content-Type"):
            h.send_header("Content-Type", resp.getheader("Content-Type"))
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        sent = 0
        limit: Optional[int] = int(self.at) if sealed and self.mode in ("truncate", "tamper") else None
        try:
            while True:
                piece = resp.read1(65536)
                if not piece:
                    break
                if limit is not None and self.mode == "truncate" and sent + len(piece) >= limit:
                    piece = piece[: limit - sent]
                    self._chunk(h, piece)
                    break  # a clean end of the body, as if the answer were complete
                if limit is not None and self.mode == "tamper" and sent <= limit < sent + len(piece):
                    i = limit - sent
                    piece = piece[:i] + bytes([piece[i] ^ 0x01]) + piece[i + 1 :]
                sent += len(piece)
                self._chunk(h, piece)
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            conn.close()

    @staticmethod
    def _chunk(h: BaseHTTPRequestHandler, piece: bytes) -> None:
        if piece:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            h.wfile.flush()
