// The chat page of `specrun serve`. Everything the model or the server writes goes into the page
// as text (textContent), never as markup; requests go only to this page's own server.
"use strict";

const HEALTH_EVERY_MS = 1000;
const conversation = []; // the turns the server answered in full, as the next request sends them
let running = null; // the AbortController of the reply being streamed

const $ = (id) => document.getElementById(id);

function element(tag, className, text = "") {
  const node = document.createElement(tag);
  node.className = className;
  node.textContent = text;
  return node;
}

function headers() {
  const key = $("key").value.trim();
  return key ? { "Content-Type": "application/json", Authorization: `Bearer ${key}` } : { "Content-Type": "application/json" };
}

// The API's error message from a response that is not ok (OpenAI's error object), or its status.
async function errorMessage(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

async function getJson(path) {
  const response = await fetch(path, { headers: headers(), cache: "no-store" });
  if (!response.ok) throw new Error(await errorMessage(response));
  return response.json();
}

// --- the server panel ---------------------------------------------------------------------

function showStatus(text) {
  $("status").textContent = text;
  $("status").hidden = !text;
}

async function loadServer() {
  try {
    const [models, server] = await Promise.all([getJson("/v1/models"), getJson("/specrun/server")]);
    $("model").textContent = models.data[0].id;
    const draft = [...server.draft.sources, ...(server.draft.model ? [server.draft.model] : [])];
    $("draft").textContent = draft.length ? `${draft.join(" + ")}, k ${server.k}` : "none (plain decoding)";
    $("context").textContent = `${server.context_tokens} tokens a slot`;
    return true;
  } catch (error) {
    $("model").textContent = $("draft").textContent = error.message;
    return false;
  }
}

let loaded = false;
let reachable = true;

// /health every second: the slots and the queue, and whether the server is there at all.
async function pollHealth() {
  try {
    const response = await fetch("/health", { cache: "no-store" });
    const health = response.ok ? await response.json() : null;
    if (!reachable) showStatus("");
    reachable = true;
    if (!health) {
      $("slots").textContent = await errorMessage(response);
      return;
    }
    const slots = health.slots_idle + health.slots_processing;
    $("slots").textContent = `${health.slots_processing} of ${slots} busy`;
    $("queue").textContent = `${health.requests_waiting} waiting`;
    if (!loaded) loaded = await loadServer();
  } catch {
    reachable = loaded = false;
    showStatus(`The server at ${location.host} is not answering; trying again every second.`);
  } finally {
    setTimeout(pollHealth, HEALTH_EVERY_MS);
  }
}

// --- a turn -------------------------------------------------------------------------------

function addTurn(text) {
  const turn = element("article", "turn");
  turn.append(element("p", "you", text), element("p", "reply"), element("p", "stats"));
  $("log").append(turn);
  return { turn, reply: turn.querySelector(".reply"), stats: turn.querySelector(".stats") };
}

// How a piece came (the stream's `specrun.pieces`): an accepted draft, forced by the grammar
// (drafted under "grammar"), or the target's own (a bonus token is the target's too).
function sourceClass(piece) {
  if (piece.source !== "draft") return "src-target";
  return piece.draft_source === "grammar" ? "src-grammar" : "src-draft";
}

function appendPiece(reply, piece) {
  const kind = sourceClass(piece);
  const last = reply.lastElementChild;
  if (last && last.className === kind) {
    last.textContent += piece.text;
  } else {
    const span = element("span", kind, piece.text);
    span.title = piece.source === "draft" ? `draft (${piece.draft_source})` : piece.source;
    reply.append(span);
  }
}

const percent = (x) => `${Math.round(100 * x)}%`;

function statsLine(s) {
  const rate = s.tokens_per_s == null ? "…" : s.tokens_per_s.toFixed(1);
  const parts = [`${s.tokens} tokens`, `${rate} tok/s`];
  if (s.k === "plain") return [...parts, "plain decoding"].join(" · ");
  const sources = Object.entries(s.accepted_by_source).filter(([, n]) => n).map(([name, n]) => `${name} ${n}`);
  return [
    ...parts,
    `acceptance ${percent(s.acceptance_rate)}`,
    `mean accepted length ${s.mean_accepted_length.toFixed(2)}`,
    `k ${s.k}` + (s.last_drafted == null ? "" : ` (last drafted ${s.last_drafted})`),
    `draft ${sources.length ? sources.join(", ") : s.draft_source || "none yet"}`,
  ].join(" · ");
}

function requestBody(text) {
  const system = $("system").value.trim();
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...conversation, { role: "user", content: text }];
  const body = { messages, stream: true, specrun: { pieces: true } };
  const temperature = $("temperature").value;
  const maxTokens = $("max-tokens").value;
  if (temperature !== "") body.temperature = Number(temperature);
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  if ($("json").checked) body.response_format = responseFormat($("schema").value.trim());
  return body;
}

// "Reply as JSON": any JSON object, or one that the schema describes.
function responseFormat(schema) {
  if (!schema) return { type: "json_object" };
  try {
    return { type: "json_schema", json_schema: { name: "reply", schema: JSON.parse(schema) } };
  } catch (error) {
    throw new Error(`the JSON schema is not JSON (${error.message})`);
  }
}

// Reads the server-sent events of a reply into the turn; returns the reply's text.
async function readStream(response, view) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the stream ended before the reply did");
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = buffer.slice(0, end).replace(/^data: /, "");
      buffer = buffer.slice(end + 2);
      if (data === "[DONE]") return text;
      text += showChunk(JSON.parse(data), view);
    }
  }
}

// One chunk into the turn; returns its text.
function showChunk(chunk, view) {
  if (chunk.error) throw new Error(chunk.error.message);
  const field = chunk.specrun;
  if (field && field.stats) view.stats.textContent = statsLine(field.stats);
  const text = chunk.choices[0]?.delta?.content || "";
  for (const piece of field?.pieces || []) appendPiece(view.reply, piece);
  return text;
}

function failed(view, message, text) {
  view.turn.append(element("p", "error", message));
  if (!$("prompt").value) $("prompt").value = text; // to send again, perhaps changed
}

async function send(text) {
  const view = addTurn(text);
  running = new AbortController();
  setRunning(true);
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody(text)), signal: running.signal,
    });
    if (!response.ok) throw new Error(await errorMessage(response));
    const reply = await readStream(response, view);
    conversation.push({ role: "user", content: text }, { role: "assistant", content: reply });
  } catch (error) {
    failed(view, error.name === "AbortError" ? "stopped; this turn is left out of the conversation" : error.message, text);
  } finally {
    running = null;
    setRunning(false);
  }
}

function setRunning(on) {
  $("send").textContent = on ? "Stop" : "Send";
}

function submit(event) {
  event.preventDefault();
  if (running) {
    running.abort();
    return;
  }
  const text = $("prompt").value;
  $("hint").hidden = Boolean(text.trim());
  if (!text.trim()) return;
  $("prompt").value = "";
  send(text);
}

// Enter sends; while a reply streams it does nothing (the Stop button stops it).
function onKey(event) {
  if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
  event.preventDefault();
  if (!running) submit(event);
}

$("hint").textContent = "Write a message first.";
$("chat").addEventListener("submit", submit);
$("prompt").addEventListener("keydown", onKey);
pollHealth();
