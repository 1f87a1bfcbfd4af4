// The private chat page. It runs the WebAssembly client (veil.js): it
// fetches the route's attestation through `veil web` (which forwards it from
// the host), verifies every shard here against the policy the user gave
// `veil web`, and only then lets a prompt be sealed to the attested entry.
// Any refusal shows the failed check and leaves the composer disabled, so
// nothing is sent. Answers are shown as text, never as markup.
//
// `window.veilPage` mirrors what is shown (state, verify time, answers,
// error) for the browser tests; `document.body.dataset.state` is one of
// loading, verifying, verified, refused, answering, answered, failed.

import { Veil, load } from "./veil.js";

// `veil web` forwards a request to the host only when it is this page's own
// fetch: it carries this header (which no navigation, <script> or other
// origin's request can), and it must stay on this origin.
const PAGE_HEADER = "X-Veil-Page";

function pageFetch(url, init = {}) {
  const headers = new Headers(init.headers);
  headers.set(PAGE_HEADER, "1");
  return fetch(url, { ...init, headers, mode: "same-origin", credentials: "omit", redirect: "error" });
}

const $ = (id) => document.getElementById(id);
const page = { state: "loading", loadMs: null, verifyMs: null, answers: [], error: null, simulated: null };
window.veilPage = page;

function setState(state, status) {
  page.state = state;
  document.body.dataset.state = state;
  $("status").textContent = status;
}

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

const LABELS = { passed: "PASS", failed: "FAIL", warned: "WARN", skipped: "SKIP", not_run: "NOT RUN" };

function detail(row) {
  switch (row.status) {
    case "passed":
      return row.detail;
    case "failed":
      return `expected ${row.expected}; shown ${row.actual}`;
    case "warned":
      return `${row.detail}: ${row.warning}`;
    default:
      return row.reason ?? "";
  }
}

const rowsOf = (table) => (Array.isArray(table) ? table : table?.results ?? []);

function checkTable(caption, table) {
  const t = el("table", "checks");
  t.append(el("caption", null, caption));
  for (const row of rowsOf(table)) {
    const tr = el("tr", `status-${row.status}`);
    const outcome = el("td", "outcome", LABELS[row.status] ?? row.status);
    if (row.simulated) {
      tr.classList.add("simulated");
      outcome.append(" ", el("span", "badge", "SIMULATED"));
    }
    tr.append(el("td", "check", row.check), outcome, el("td", "detail", detail(row)));
    t.append(tr);
  }
  return t;
}

function showRoute(route) {
  const doc = route.json;
  page.simulated = doc.simulated;
  $("route-summary").textContent =
    `${doc.verdict}. Model ${doc.model}; ${doc.shards.length} shard(s); ` +
    `peer policy ${doc.peer_policy.slice(0, 16)}…, route shape ${doc.route_shape.slice(0, 16)}…`;
  if (doc.simulated) $("route-summary").classList.add("simulated-route");
  for (const w of doc.warnings) $("warnings").append(el("li", null, w));
  const shards = $("shards");
  for (const s of doc.shards) {
    const box = el("details", s.simulated ? "shard simulated" : "shard");
    const summary = el("summary", null, `${s.role}: stage ${s.stage} replica ${s.replica}, layers ${s.layers}: ${s.verdict}`);
    if (s.simulated) summary.append(" ", el("span", "badge", "SIMULATED"));
    box.append(summary, checkTable("SEV-SNP evidence", s.checks));
    for (const g of s.gpus ?? []) box.append(checkTable(`GPU ${g.gpu_index}: ${g.verdict}`, g.checks));
    shards.append(box);
  }
  const routeBox = el("details", "shard");
  routeBox.append(el("summary", null, "route: coverage, bindings, peer policy"), checkTable("Route", doc.route_checks));
  shards.append(routeBox);
}

function showRefusal(e) {
  page.error = { kind: e.kind ?? "error", message: e.message, who: e.who ?? null, checks: e.checks ?? null };
  $("refusal").hidden = false;
  $("route-summary").textContent = "The route was not accepted.";
  $("refusal-message").textContent = `${e.kind ?? "error"}: ${e.message}`;
  const pre = $("refusal-checks");
  for (const line of String(e.checks ?? "").split("\n")) {
    pre.append(el("span", /\bFAIL\b/.test(line) ? "failed-line" : null, line + "\n"));
  }
  setState("refused", "Refused: nothing was sent");
}

function addMessage(role, text) {
  const li = el("li", `message ${role}`);
  li.append(el("span", "role", role === "user" ? "You" : "Model"), el("div", "text", text));
  $("messages").append(li);
  li.scrollIntoView({ block: "end" });
  return li.querySelector(".text");
}

async function main() {
  setState("loading", "Loading…");
  const [policy, config] = await Promise.all([
    fetch("/policy.toml").then((r) => r.text()),
    fetch("/config.json").then((r) => r.json()),
  ]);
  $("host").textContent = config.host;
  $("version").textContent = `veil ${config.version}`;
  // The WebAssembly module is compiled first, so the verify time is the
  // route's: the attestation fetched through the relay and every check.
  const loading = performance.now();
  await load();
  page.loadMs = performance.now() - loading;
  setState("verifying", "Verifying every shard…");
  const started = performance.now();
  let route;
  try {
    route = await Veil.verify(location.origin, policy, { fetch: pageFetch });
  } catch (e) {
    page.verifyMs = performance.now() - started;
    $("verify-ms").textContent = `${page.verifyMs.toFixed(0)} ms`;
    showRefusal(e);
    return;
  }
  page.verifyMs = performance.now() - started;
  $("verify-ms").textContent = `${page.verifyMs.toFixed(0)} ms`;
  showRoute(route);
  // Simulated evidence is not a green "Verified": the status says what was
  // accepted, in the warning colour (style.css, data-simulated).
  document.body.dataset.simulated = String(route.simulated);
  setState(
    "verified",
    route.simulated ? "SIMULATED attestation: accepted by a development policy, no hardware verified" : "Verified",
  );
  const history = [];
  const prompt = $("prompt");
  prompt.disabled = false;
  $("send").disabled = false;
  prompt.focus();
  $("composer").addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = prompt.value.trim();
    if (!text || page.state === "answering") return;
    prompt.value = "";
    $("send").disabled = true;
    addMessage("user", text);
    history.push({ role: "user", content: text });
    const out = addMessage("assistant", "");
    setState("answering", "Answering…");
    const params = { max_tokens: Number($("max-tokens").value), temperature: Number($("temperature").value) };
    const stream = route.chat(history.slice(), params);
    let answer = "";
    try {
      for await (const piece of stream) {
        answer += piece;
        out.textContent = answer;
      }
      history.push({ role: "assistant", content: answer });
      page.answers.push(answer);
      if (stream.finishReason === "length") out.parentElement.append(el("div", "cut", "[cut at max tokens]"));
      setState("answered", `Answered (${stream.finishReason ?? "end"})`);
    } catch (e) {
      // Authenticated pieces shown so far stay, marked; the turn leaves the
      // history, so the next prompt does not build on a cut answer.
      history.pop();
      out.parentElement.classList.add("failed");
      out.parentElement.append(el("div", "cut", `${e.kind ?? "error"}: ${e.message}`));
      page.error = { kind: e.kind ?? "error", message: e.message };
      setState("failed", `Failed: ${e.kind ?? "error"}`);
    } finally {
      $("send").disabled = false;
    }
  });
}

main().catch((e) => {
  page.error = { kind: "page", message: String(e?.message ?? e) };
  $("refusal").hidden = false;
  $("refusal-message").textContent = `The page could not start: ${page.error.message}`;
  setState("refused", "Refused: nothing was sent");
});
