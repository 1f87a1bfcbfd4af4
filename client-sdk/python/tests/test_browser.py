"""The private chat page (`veil web`, client-sdk/web) in a real headless
Chromium (Debian's chromium and chromium-driver, driven by selenium; no
browser is downloaded), against the local cluster: the page verifies the
route in the browser and shows it, answers like the Rust SDK, and shows a
refusal with nothing sent when the relay replays evidence. A screenshot of
each state is saved under target/browser-screenshots/."""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from conftest import REPO, Cluster, binary, free_port, npm_package, unavailable
from relay import Relay

PROMPT = "Name three colours of the rainbow."
TOKENS = 24
SHOTS = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "browser-screenshots"


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
    assert "connect-src 'self'" in headers["Content-Security-Policy"]
    assert fetch(web_through.url + "/veil_wasm_bg.wasm")[1]["Content-Type"] == "application/wasm"
    # A DNS-rebinding page (another Host) and another origin get nothing.
    assert fetch(web_through.url + "/policy.toml", headers={"Host": "evil.example:80"})[0] == 403
    other_origin = {"Origin": "http://evil.example", "Content-Type": "message/ohttp-chunked-req"}
    assert fetch(web_through.url + "/v1/sealed", "POST", other_origin, b"x")[0] == 403
    # Only the nonce query, only the sealed type; no other API is forwarded.
    assert fetch(web_through.url + "/v1/attestation?nonce=00")[0] == 400
    assert fetch(web_through.url + "/v1/sealed", "POST", {"Content-Type": "application/json"}, b"{}")[0] == 415
    assert fetch(web_through.url + "/v1/models")[0] == 404
    assert fetch(web_through.url + "/v1/chat/completions", "POST", {}, b"{}")[0] == 405
    assert relay.requests == []
    status, _, doc = fetch(web_through.url + "/v1/attestation?nonce=" + "ab" * 32)
    assert status == 200 and doc.startswith(b"{")
    assert relay.requests == [("GET", "/v1/attestation?nonce=" + "ab" * 32)]
    # A host that floods the attestation answer has it cut at the SDK's
    # limit (8 MiB): the page's connection is aborted, never ended cleanly.
    relay.set("flood", 12)
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        fetch(web_through.url + "/v1/attestation?nonce=" + "ab" * 32)
