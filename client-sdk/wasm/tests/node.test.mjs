// The WebAssembly client in Node against a local cluster, run by
// client-sdk/python/tests/test_node.py, which starts the cluster and sets:
//   VEIL_NPM_PACKAGE  target/npm/veil-client (scripts/build-wasm.sh)
//   VEIL_URL, VEIL_POLICY (a policy file pinning the cluster's simulated root)
//   VEIL_OTHER_POLICY (one pinning another root), VEIL_EXPECTED (the greedy
//   answer `veil chat` gave), VEIL_PROMPT, VEIL_TOKENS.
// The host's misbehaviour is played by fetch doubles: the bytes the client
// receives are exactly what a relay could send.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

const pkg = process.env.VEIL_NPM_PACKAGE;
const { Veil, load } = await import(pathToFileURL(join(pkg, "veil.js")).href);
await load(readFileSync(join(pkg, "veil_wasm_bg.wasm")));

const url = process.env.VEIL_URL;
const policy = readFileSync(process.env.VEIL_POLICY, "utf8");
const otherPolicy = readFileSync(process.env.VEIL_OTHER_POLICY, "utf8");
const messages = [{ role: "user", content: process.env.VEIL_PROMPT }];
const params = { max_tokens: Number(process.env.VEIL_TOKENS), temperature: 0 };

/** A fetch that records every request and passes sealed answers through `edit`. */
function relay(edit) {
  const seen = [];
  const fetchFn = async (input, init = {}) => {
    const method = init.method ?? "GET";
    seen.push(`${method} ${new URL(input).pathname}`);
    const res = await fetch(input, init);
    if (method !== "POST" || !edit) return res;
    const body = new Uint8Array(await res.arrayBuffer());
    return new Response(edit(body), { status: res.status, headers: res.headers });
  };
  return { fetchFn, seen };
}

test("verifies the route in-process and shows its checks", async () => {
  const route = await Veil.verify(url, policy);
  assert.equal(route.simulated, true);
  assert.match(route.checks, /== entry/);
  assert.match(route.checks, /== route/);
  assert.ok(route.warnings.some((w) => /simulated/i.test(w)));
  const json = route.json;
  assert.equal(json.accepted, true);
  assert.ok(json.shards.length >= 4 && json.shards.every((s) => s.simulated));
});

test("a greedy answer equals the Rust SDK's", async () => {
  const route = await Veil.verify(url, policy);
  const stream = route.chat(messages, params);
  let text = "";
  for await (const t of stream) text += t;
  assert.equal(text.trim(), process.env.VEIL_EXPECTED);
  assert.ok(["stop", "length"].includes(stream.finishReason));
  // The entry's receipt, checked in wasm before the stream ended.
  assert.ok(/^[0-9a-f]{64}$/.test(stream.receipt.route) && /^[0-9a-f]{128}$/.test(stream.receipt.signature));
  assert.ok(stream.receipt.completion_tokens > 0 && stream.receipt.prompt_tokens > 0);
});

test("an answer the host cut or altered rejects as truncated", async () => {
  for (const edit of [
    (b) => b.slice(0, b.length - 40), // a clean end before the final chunk
    (b) => b.slice(0, 30), // inside the head
    (b) => { const c = b.slice(); c[c.length - 60] ^= 1; return c; }, // one bit in the last chunks
    (b) => { const c = b.slice(); c[40] ^= 1; return c; }, // one bit in the head
  ]) {
    const { fetchFn, seen } = relay(edit);
    const route = await Veil.verify(url, policy, { fetch: fetchFn });
    await assert.rejects(route.chatText(messages, params), (e) => e.name === "VeilError" && e.kind === "truncated");
    assert.deepEqual(seen.filter((s) => s.startsWith("POST")), ["POST /v1/sealed"]);
  }
  // The same relay passing the bytes: an answer.
  const { fetchFn } = relay((b) => b);
  const route = await Veil.verify(url, policy, { fetch: fetchFn });
  assert.equal((await route.chatText(messages, params)).trim(), process.env.VEIL_EXPECTED);
});

test("a route under another root is refused before anything is sent", async () => {
  const { fetchFn, seen } = relay();
  await assert.rejects(Veil.verify(url, otherPolicy, { fetch: fetchFn }), (e) => {
    assert.equal(e.kind, "attestation");
    assert.match(e.checks, /FAIL/);
    return true;
  });
  assert.ok(seen.length >= 1 && seen.every((s) => s.startsWith("GET /v1/attestation")));
});

test("a replayed attestation document fails the nonce", async () => {
  let first;
  const replaying = async (input, init) => {
    if (first) return new Response(first);
    const res = await fetch(input, init);
    first = new Uint8Array(await res.arrayBuffer());
    return new Response(first);
  };
  await Veil.verify(url, policy, { fetch: replaying });
  await assert.rejects(
    Veil.verify(url, policy, { fetch: replaying }),
    (e) => e.name === "VeilError" && ["attestation", "route_rejected"].includes(e.kind),
  );
});

/** A fetch that answers the first `n` sealed requests 503 with Retry-After: 1, unrelayed. */
function shedding(n) {
  const seen = [];
  const fetchFn = async (input, init = {}) => {
    const method = init.method ?? "GET";
    if (method === "POST") {
      seen.push(Date.now());
      if (seen.length <= n) {
        return new Response("overloaded: the queue is full\n", { status: 503, headers: { "retry-after": "1" } });
      }
    }
    return fetch(input, init);
  };
  return { fetchFn, seen };
}

test("a request shed for load is sealed again after Retry-After; one shed every time is given up on", async () => {
  // Shed twice, then relayed: three sends, a second apart at least, and the answer.
  let { fetchFn, seen } = shedding(2);
  let route = await Veil.verify(url, policy, { fetch: fetchFn });
  assert.equal((await route.chatText(messages, params)).trim(), process.env.VEIL_EXPECTED);
  assert.equal(seen.length, 3);
  assert.ok(seen[1] - seen[0] >= 1000 && seen[2] - seen[1] >= 1000, `Retry-After not waited: ${seen}`);
  // Shed every time, retries: 1: two sends, then the typed refusal.
  ({ fetchFn, seen } = shedding(Infinity));
  route = await Veil.verify(url, policy, { fetch: fetchFn, retries: 1 });
  await assert.rejects(route.chatText(messages, params), (e) => e.kind === "refused" && e.status === 503);
  assert.equal(seen.length, 2);
  // retries: 0 sends once.
  ({ fetchFn, seen } = shedding(Infinity));
  route = await Veil.verify(url, policy, { fetch: fetchFn, retries: 0 });
  await assert.rejects(route.chatText(messages, params), (e) => e.kind === "refused" && e.status === 503);
  assert.equal(seen.length, 1);
  await assert.rejects(Veil.verify(url, policy, { retries: -1 }), (e) => e.kind === "config");
});

test("bad input gets a typed error", async () => {
  await assert.rejects(Veil.verify("ftp://x", policy), (e) => e.kind === "config");
  await assert.rejects(Veil.verify(url, "allow_debug = maybe"), (e) => e.kind === "config");
  await assert.rejects(Veil.verify("http://127.0.0.1:9", policy), (e) => e.kind === "unreachable");
  await assert.rejects(Veil.verify(`${url}/v1`, policy), (e) => e.kind === "protocol" && /root URL/.test(e.message));
  const route = await Veil.verify(url, policy);
  await assert.rejects(route.chatText(messages, { max_tokens: 100000 }), (e) => e.kind === "api" && e.status === 400);
});
