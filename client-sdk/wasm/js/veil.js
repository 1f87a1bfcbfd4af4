// The Veil client for browsers and Node: verify a route and seal requests to
// it in the page or process. The verifier and the seal are the Rust SDK's own
// code compiled to WebAssembly (veil_wasm.js / veil_wasm_bg.wasm); this file
// does the I/O. The clock is the platform's (Date.now()) and the nonce comes
// from Web Crypto.
//
//   import { Veil } from "veil-client";
//   const route = await Veil.verify("http://127.0.0.1:8080", policyToml);
//   for await (const t of route.chat([{ role: "user", content: "Hello" }])) out += t;
//
// Every failure is a VeilError with a `kind`: config, unreachable, protocol,
// attestation, route_rejected (nothing was sent; `checks` holds the failed
// table), refused (the host's status), api (the attested entry's error),
// truncated (the answer did not open to its authenticated end), receipt (it
// opened, but the entry's signed receipt for it is missing or wrong).

import init, { verifyDocument } from "./veil_wasm.js";

const ATTESTATION_PATH = "/v1/attestation";
const SEALED_PATH = "/v1/sealed";
const SEALED_REQUEST_TYPE = "message/ohttp-chunked-req";
const CHAT_COMPLETIONS_PATH = "/v1/chat/completions";
/** The largest attestation document read (the SDK's MAX_DOC_BYTES). */
const MAX_DOC_BYTES = 8 << 20;
/** The longest Retry-After honoured, seconds (the host's word, unauthenticated). */
const MAX_RETRY_AFTER_SECS = 30;
/** Back-off between tries of a request shed for load: first and longest, ms. */
const FIRST_BACKOFF_MS = 250;
const MAX_BACKOFF_MS = 8000;

let ready;

const inNode = typeof process !== "undefined" && process.versions?.node !== undefined;

/** The module's bytes in Node: the package's own veil_wasm_bg.wasm, read from disk. */
async function nodeWasm() {
  const { readFile } = await import("node:fs/promises");
  return readFile(new URL("./veil_wasm_bg.wasm", import.meta.url));
}

/**
 * Loads the WebAssembly module once (every call after the first that
 * succeeded returns the same promise). Without an argument, browsers fetch
 * it next to this file and Node reads the package's own copy; a page that
 * serves it elsewhere passes its URL, and anyone may pass its bytes.
 * Fails with a VeilError of kind `config`; a failed load may be retried.
 */
export function load(wasm) {
  ready ??= (async () => {
    const source = wasm ?? (inNode ? await nodeWasm() : undefined);
    return init(source === undefined ? undefined : { module_or_path: source });
  })().catch((e) => {
    ready = undefined;
    throw fail("config", `the WebAssembly module did not load: ${e?.message ?? e}`);
  });
  return ready;
}

function fail(kind, message, extra = {}) {
  const e = new Error(message);
  e.name = "VeilError";
  Object.assign(e, { kind, checks: null, who: null }, extra);
  return e;
}

const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

export const Veil = {
  /**
   * Fetches the route's attestation through the host at `url` with a fresh
   * nonce and verifies every shard against `policy` (the policy file's TOML
   * text). Rejects (kind attestation or route_rejected, with the check
   * table) before anything is sent when the route fails.
   */
  async verify(url, policy, options = {}) {
    await load(options.wasm);
    const base = String(url).replace(/\/+$/, "");
    if (!/^https?:\/\//.test(base)) throw fail("config", `${base}: the host's URL must start with http:// or https://`);
    const fetchFn = options.fetch ?? globalThis.fetch.bind(globalThis);
    const nonce = crypto.getRandomValues(new Uint8Array(32));
    let res;
    try {
      res = await fetchFn(`${base}${ATTESTATION_PATH}?nonce=${hex(nonce)}`);
    } catch (e) {
      throw fail("unreachable", `host unreachable: ${e.message}`);
    }
    if (!res.ok) {
      const hint = res.status === 404 ? ": give the Veil host's root URL (no path such as /v1)" : "";
      throw fail("protocol", `attestation endpoint answered ${res.status}${hint}`, { status: res.status });
    }
    const doc = new Uint8Array(await res.arrayBuffer());
    if (doc.length > MAX_DOC_BYTES) throw fail("protocol", `attestation document over ${MAX_DOC_BYTES} bytes`);
    const route = verifyDocument(doc, policy, nonce, Date.now());
    const retries = options.retries ?? 3;
    if (!Number.isInteger(retries) || retries < 0) throw fail("config", `retries must be a whole number >= 0, not ${retries}`);
    return new VerifiedRoute(base, route, fetchFn, retries);
  },
};

/** A Retry-After in delta-seconds, capped; anything else is none. */
function retryAfterMs(res) {
  const v = (res.headers.get("retry-after") ?? "").trim();
  return /^[0-9]{1,10}$/.test(v) ? Math.min(Number(v), MAX_RETRY_AFTER_SECS) * 1000 : 0;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const shedForLoad = (status) => status === 429 || status === 503;

/** A verified route: its check tables, and chat sealed to its entry. */
export class VerifiedRoute {
  constructor(base, native, fetchFn, retries = 3) {
    this.url = base;
    this.native = native;
    this.fetch = fetchFn;
    // A request shed for load (429 or 503, the host's or the entry's) is
    // sealed again and re-sent this many times; nothing else is.
    this.retries = retries;
  }

  /** Every shard's check table and the route's, as `veil verify` prints them. */
  get checks() {
    return this.native.checks;
  }
  /** The whole verdict (the document `veil verify --json` prints). */
  get json() {
    return JSON.parse(this.native.json);
  }
  /** Whether any shard's evidence is simulated (development only). */
  get simulated() {
    return this.native.simulated;
  }
  /** Every warning a reviewer must see. */
  get warnings() {
    return this.native.warnings;
  }
  /** The model the route serves. */
  get model() {
    return this.native.model;
  }

  /**
   * A chat answer streamed as text pieces: `for await (const t of
   * route.chat(messages, { max_tokens: 64 }))`. It ends only at the seal's
   * authenticated end; a cut or altered answer rejects (kind truncated).
   */
  chat(messages, params = {}) {
    return new ChatStream(this, messages, params);
  }

  /** `chat`, collected: resolves to the whole answer's text. */
  async chatText(messages, params = {}) {
    let text = "";
    for await (const t of this.chat(messages, params)) text += t;
    return text;
  }
}

/**
 * A streamed chat answer; `finishReason` and `receipt` (the entry's signed
 * receipt, checked against the verified route, the sealed request and the
 * answer) are set once it has ended.
 */
export class ChatStream {
  constructor(route, messages, params) {
    if ("messages" in params || "stream" in params) {
      throw fail("config", "give messages as the first argument; chat() sets `stream` itself");
    }
    this.route = route;
    this.body = JSON.stringify({ ...params, messages, stream: true });
    this.finishReason = null;
    this.receipt = null;
  }

  async *[Symbol.asyncIterator]() {
    // A request shed for load (429 or 503: the relay's queue, or the
    // entry's ceiling inside the seal) is sealed anew and re-sent after the
    // host's Retry-After (capped) and a jittered, doubling back-off, at
    // most `route.retries` times. Nothing else is re-sent.
    let backoff = FIRST_BACKOFF_MS;
    for (let attempt = 0; ; attempt++) {
      const again = attempt < this.route.retries;
      const wait = await (yield* this.#once(again));
      if (wait === undefined) return;
      await sleep(wait + backoff * Math.random());
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    }
  }

  /**
   * One try: yields the answer's text and returns undefined, or, when it was
   * shed for load and `again` allows one more, returns the advised wait (ms).
   */
  async *#once(again) {
    const sealed = this.route.native.seal("POST", CHAT_COMPLETIONS_PATH, new TextEncoder().encode(this.body), Date.now());
    const abort = new AbortController();
    let res;
    try {
      res = await this.route.fetch(`${this.route.url}${SEALED_PATH}`, {
        method: "POST",
        // What the request costs in slots (its choices and log-probabilities):
        // the relay charges this client's share by it.
        headers: { "content-type": SEALED_REQUEST_TYPE, "veil-cost": String(sealed.cost) },
        body: sealed.request,
        signal: abort.signal,
      });
    } catch (e) {
      throw fail("unreachable", `host unreachable: ${e.message}`);
    }
    if (!res.ok) {
      const text = (await res.text()).slice(0, 1024);
      if (again && shedForLoad(res.status)) return retryAfterMs(res);
      throw fail("refused", `${res.status}: ${text}`, { status: res.status });
    }
    const opening = sealed.open();
    // The host's bytes go to the opener as they arrive; only what it
    // authenticates comes back.
    const pump = (async () => {
      try {
        const reader = res.body.getReader();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          opening.push(value);
        }
        opening.finish();
      } catch (e) {
        opening.fail(String(e));
      }
    })();
    try {
      const status = await opening.head();
      const decoder = new TextDecoder();
      if (status !== 200) {
        if (again && shedForLoad(status)) return 0;
        let text = "";
        for (let p; (p = await opening.next()) !== undefined; ) text += decoder.decode(p, { stream: true });
        let message = text.slice(0, 1024);
        try {
          message = JSON.parse(text).error.message ?? message;
        } catch {
          // not JSON: the text as it is
        }
        throw fail("api", `${status}: ${message}`, { status });
      }
      // Text until an event is whole (`\n\n`); the decoder keeps a character
      // cut between two pieces until its rest arrives.
      let buffer = "";
      for (let piece; (piece = await opening.next()) !== undefined; ) {
        buffer += decoder.decode(piece, { stream: true });
        for (let end; (end = buffer.indexOf("\n\n")) >= 0; ) {
          const event = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = event
            .split("\n")
            .filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(5).trimStart())
            .join("\n");
          if (!data || data === "[DONE]") continue;
          let v;
          try {
            v = JSON.parse(data);
          } catch (e) {
            throw fail("protocol", `an event: ${e.message}`);
          }
          if (v.error) throw fail("api", v.error.message ?? JSON.stringify(v.error), { status: 200 });
          const choice = v.choices?.[0];
          if (choice?.finish_reason) this.finishReason = choice.finish_reason;
          if (choice?.delta?.content) yield choice.delta.content;
        }
      }
      if (buffer.trim()) throw fail("protocol", "the stream ended inside an event");
      const receipt = opening.receipt;
      this.receipt = receipt === undefined ? null : JSON.parse(receipt);
      return undefined;
    } finally {
      abort.abort();
      await pump;
    }
  }
}
