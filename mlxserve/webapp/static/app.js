"use strict";
// The web app: Chat, Models and Status pages over the server's own API. Everything it
// shows comes from the API with the key this browser keeps; nothing here bypasses it.

const KEY_STORE = "mlxserve.apiKey";
const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);
const state = { models: [], history: [], attachments: [], controller: null, page: "chat", timer: null, talk: null, recorder: null, tools: new Set() };
// The media a model may be sent (its input_modalities), in the order the picker offers them
const MEDIA = ["image", "video", "audio"];

// ---------------------------------------------------------------------------- plumbing

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, props);
  for (const child of children) node.append(child);
  return node;
}

function requestHeaders(json) {
  const headers = json ? { "Content-Type": "application/json" } : {};
  const key = localStorage.getItem(KEY_STORE);
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    message = (body.error && body.error.message) || message;
  } catch (_) { /* not JSON: the status says it */ }
  if (response.status === 401) askForKey(message);
  return new Error(message);
}

async function api(path, body) {
  const init = body === undefined
    ? { headers: requestHeaders(false) }
    : { method: "POST", headers: requestHeaders(true), body: JSON.stringify(body) };
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response.json();
}

function showBanner(text) {
  $("banner").textContent = text || "";
  $("banner").hidden = !text;
}

function askForKey(message) {
  $("key-form").hidden = false;
  showBanner(`${message} Enter this server's API key above.`);
  $("key-input").focus();
}

async function* serverSentData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart());
      if (data.length) yield data.join("\n");
    }
  }
}

// mlxserve/units.py's format_bytes: a GB is 2**30 bytes (the unit of the --*-gb flags), so
// the Models page and the start-up screen show the same figure for the same memory.
function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "—";
  if (bytes >= 2 ** 30) return `${(bytes / 2 ** 30).toFixed(2)} GB`;
  if (bytes >= 2 ** 20) return `${(bytes / 2 ** 20).toFixed(1)} MB`;
  return `${(bytes / 2 ** 10).toFixed(0)} kB`;
}

const seconds = (value) => (value === null || value === undefined ? "—" : `${value.toFixed(2)} s`);
const rate = (value) => (value === null || value === undefined ? "—" : value.toFixed(1));

// ---------------------------------------------------------------------------- pages

function showPage(page) {
  state.page = page;
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.page === page);
  for (const name of ["chat", "models", "status"]) $(`page-${name}`).hidden = name !== page;
  clearInterval(state.timer);
  refresh();
  if (page !== "chat") state.timer = setInterval(refresh, POLL_MS);
}

async function refresh() {
  try {
    const status = await api("/v1/status");
    state.models = status.models;
    showBanner(status.warnings.join(" ")); // an exposed server says so on every page
    renderModelPicker(status.default_model);
    renderToolToggles(status.mcp_servers);
    if (state.page === "models") renderModels(status);
    if (state.page === "status") renderStatus(status);
  } catch (error) {
    if (!$("key-form").hidden) return; // the key form says what is wrong
    showBanner(`The server did not answer: ${error.message}`);
  }
}

// ---------------------------------------------------------------------------- chat

// the kinds that answer /v1/chat/completions (an adapter: its base model, adapted), and
// image models, whose answer to a message is an image (/v1/images/generations)
const CHAT_KINDS = ["chat", "vision", "adapter", "image"];

function chatModels() {
  return state.models.filter((m) => CHAT_KINDS.includes(m.kind));
}

function renderModelPicker(defaultModel) {
  const select = $("model-select");
  const chosen = select.value || defaultModel;
  select.replaceChildren(...chatModels().map((m) => el("option", {
    value: m.id,
    textContent: m.state === "loaded" ? m.id : `${m.id} (not loaded)`,
    selected: m.id === chosen,
  })));
  updateAttach();
}

function selectedModel() {
  return state.models.find((m) => m.id === $("model-select").value);
}

function updateAttach() {
  const model = selectedModel();
  const draws = Boolean(model && model.kind === "image");
  const media = draws || !model ? [] : MEDIA.filter((m) => model.input_modalities.includes(m));
  $("attach-label").hidden = media.length === 0;
  $("attach-label").firstChild.textContent = media.length === 1 ? "Image" : "Attach";
  $("attach").accept = media.map((m) => `${m}/*`).join(",");
  $("record").hidden = !media.includes("audio");
  $("image-size-label").hidden = !draws;
  // a voice session needs a transcription and a speech model beside the chat model
  const kinds = new Set(state.models.map((m) => m.kind));
  $("talk").hidden = draws || !model || !kinds.has("transcription") || !kinds.has("speech");
  $("prompt").placeholder = draws
    ? "Describe an image to draw (Enter sends)"
    : "Send a message (Enter sends, Shift+Enter for a new line)";
}

function numberSetting(id) {
  const value = $(id).value.trim();
  return value === "" ? undefined : Number(value);
}

function userMessage(text, attachments) {
  const node = el("div", { className: "message user", textContent: text });
  for (const attachment of attachments) node.append(preview(attachment));
  $("messages").append(node);
}

// An attachment as the page shows it: a picture, or a clip with its player.
function preview(attachment) {
  if (attachment.kind === "image") return el("img", { src: attachment.url, alt: attachment.name });
  return el(attachment.kind, { src: attachment.url, controls: true, title: attachment.name });
}

// An attachment as Chat Completions takes it (an image, vLLM's video part, OpenAI's audio).
function contentPart(attachment) {
  const url = attachment.url;
  if (attachment.kind === "image") return { type: "image_url", image_url: { url } };
  if (attachment.kind === "video") return { type: "video_url", video_url: { url } };
  return { type: "input_audio", input_audio: { data: url.slice(url.indexOf(",") + 1), format: audioFormat(url) } };
}

// "data:audio/webm;codecs=opus;base64,..." -> "webm" (audio/mpeg: "mp3"; audio/x-wav: "wav")
function audioFormat(url) {
  const subtype = url.slice("data:audio/".length).split(/[;,]/)[0];
  return { mpeg: "mp3", "x-wav": "wav", wave: "wav" }[subtype] || subtype;
}

// One assistant reply as it streams: its reasoning (collapsed), text, tool calls, figures.
class ReplyView {
  constructor() {
    this.node = el("div", { className: "message assistant" });
    this.reasoningBlock = el("details", { className: "reasoning", hidden: true },
      el("summary", { textContent: "Reasoning" }));
    this.reasoningText = el("div", { className: "reasoning-text" });
    this.reasoningBlock.append(this.reasoningText);
    this.body = el("div", { className: "content" });
    this.tools = el("div");
    this.stats = el("div", { className: "stats" });
    this.node.append(this.reasoningBlock, this.body, this.tools, this.stats);
    $("messages").append(this.node);
  }

  reasoning(text) {
    this.reasoningBlock.hidden = false;
    this.reasoningText.textContent = text;
  }

  content(text) {
    this.body.innerHTML = renderMarkdown(text); // escaped by renderMarkdown
    this.node.scrollIntoView({ block: "end" });
  }

  toolCalls(calls) {
    this.tools.replaceChildren(...calls.map((call) => el("div", { className: "tool-call" },
      "Tool call ", el("strong", { textContent: call.name }), " ", el("code", { textContent: call.arguments }),
      ...(call.result === undefined ? [] : [" → ", el("code", { className: "tool-result", textContent: call.result })]))));
  }

  figures(text) {
    this.stats.textContent = text;
  }

  error(message) {
    this.node.classList.add("error");
    this.stats.textContent = message;
  }
}

function figures(started, first, ended, usage) {
  const parts = [];
  if (first !== null) parts.push(`TTFT ${((first - started) / 1000).toFixed(2)} s`);
  if (usage && first !== null && usage.completion_tokens > 1 && ended > first) {
    parts.push(`${((usage.completion_tokens - 1) / ((ended - first) / 1000)).toFixed(1)} tok/s`);
  }
  if (usage) {
    const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    parts.push(`prompt cache ${cached}/${usage.prompt_tokens} tokens`);
    parts.push(`${usage.completion_tokens} tokens out`);
  }
  return parts.join(" · ");
}

function chatBody() {
  const system = $("system-prompt").value.trim();
  const body = {
    model: $("model-select").value,
    messages: [...(system ? [{ role: "system", content: system }] : []), ...state.history],
    stream: true,
    stream_options: { include_usage: true },
  };
  for (const [field, id] of [["temperature", "temperature"], ["top_p", "top-p"], ["max_tokens", "max-tokens"]]) {
    const value = numberSetting(id);
    if (value !== undefined) body[field] = value;
  }
  return body;
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  const attachments = state.attachments;
  if ((!text && !attachments.length) || state.controller) return;
  const content = attachments.length ? [...attachments.map(contentPart), { type: "text", text }] : text;
  state.history.push({ role: "user", content });
  userMessage(text, attachments);
  $("prompt").value = "";
  state.attachments = [];
  $("attachments").replaceChildren();
  const model = selectedModel();
  if (model && model.kind === "image") {
    state.history.pop(); // a drawing is no turn of the conversation
    await draw(new ReplyView(), text);
    return;
  }
  await reply(new ReplyView());
}

// POST `body` to `path` and hand each server-sent event's data to `onData`, the Stop
// button armed meanwhile; a failure is shown in `view`. True when the stream ended well.
async function streamed(view, path, body, onData) {
  state.controller = new AbortController();
  $("stop").hidden = false;
  $("send").disabled = true;
  try {
    const response = await fetch(path, {
      method: "POST", headers: requestHeaders(true), body: JSON.stringify(body), signal: state.controller.signal,
    });
    if (!response.ok) throw await failure(response);
    for await (const data of serverSentData(response)) {
      if (data === "[DONE]") break;
      const parsed = JSON.parse(data);
      if (parsed.error) throw new Error(parsed.error.message);
      onData(parsed);
    }
    return true;
  } catch (error) {
    view.error(error.name === "AbortError" ? "Stopped." : error.message);
    return false;
  } finally {
    state.controller = null;
    $("stop").hidden = true;
    $("send").disabled = false;
  }
}

// An image model's answer: its partial images as they come, then the image.
async function draw(view, prompt) {
  const started = performance.now();
  const image = el("img", { className: "drawn", alt: prompt });
  const size = $("image-size").value.trim() || "auto";
  const body = { model: $("model-select").value, prompt, size, stream: true, partial_images: 2 };
  view.figures("drawing…");
  await streamed(view, "/v1/images/generations", body, (event) => {
    image.src = `data:image/${event.output_format};base64,${event.b64_json}`;
    if (!image.isConnected) view.body.replaceChildren(image);
    view.node.scrollIntoView({ block: "end" });
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    const done = event.type === "image_generation.completed";
    view.figures(done ? `${event.size} · ${seconds} s` : `drawing… (${event.partial_image_index + 1}) · ${seconds} s`);
    image.classList.toggle("partial", !done);
  });
  refresh();
}

// A toggle per MCP server that is ready: a message sent with one on goes to the Responses
// API with that server's tools, which the server runs (its calls shown with their results).
function renderToolToggles(servers) {
  const ready = servers.filter((server) => server.state === "ready");
  const box = $("mcp-tools");
  box.hidden = ready.length === 0;
  box.replaceChildren(el("span", { textContent: "Tools" }), ...ready.map((server) => {
    const input = el("input", { type: "checkbox", checked: state.tools.has(server.name) });
    input.addEventListener("change", () => {
      if (input.checked) state.tools.add(server.name);
      else state.tools.delete(server.name);
    });
    return el("label", { title: server.tools.join(", ") }, input, ` ${server.name}`);
  }));
}

// The conversation as the Responses API's input items.
function responsesInput() {
  return state.history.map((message) => {
    if (typeof message.content === "string") return { role: message.role, content: message.content };
    return {
      role: message.role,
      content: message.content.map(responsesPart),
    };
  });
}

// A Chat Completions content part as the Responses API's (a video: an input_file).
function responsesPart(part) {
  if (part.type === "text") return { type: "input_text", text: part.text };
  if (part.type === "image_url") return { type: "input_image", image_url: part.image_url.url };
  if (part.type === "video_url") return { type: "input_file", file_data: part.video_url.url, filename: "video" };
  return part; // input_audio: the same in both
}

function responsesBody() {
  const system = $("system-prompt").value.trim();
  const body = {
    model: $("model-select").value,
    input: responsesInput(),
    stream: true,
    store: false,
    tools: [...state.tools].map((label) => ({ type: "mcp", server_label: label, require_approval: "never" })),
  };
  if (system) body.instructions = system;
  for (const [field, id] of [["temperature", "temperature"], ["top_p", "top-p"], ["max_output_tokens", "max-tokens"]]) {
    const value = numberSetting(id);
    if (value !== undefined) body[field] = value;
  }
  return body;
}

// A reply through the Responses API with MCP tools: text, reasoning, and each call the
// server ran with its result, as the events come.
async function replyWithTools(view) {
  const started = performance.now();
  let first = null;
  let usage = null;
  let text = "";
  let reasoning = "";
  const calls = new Map(); // item id -> {name, arguments, result}
  const ended = await streamed(view, "/v1/responses", responsesBody(), (event) => {
    if (event.type === "error") throw new Error(event.message);
    if (event.type === "response.failed") throw new Error(event.response.error.message);
    if (event.type === "response.completed") {
      const u = event.response.usage;
      usage = { prompt_tokens: u.input_tokens, completion_tokens: u.output_tokens,
        prompt_tokens_details: { cached_tokens: u.input_tokens_details.cached_tokens } };
    }
    if (first === null && /delta$/.test(event.type)) first = performance.now();
    if (event.type === "response.reasoning_text.delta") view.reasoning((reasoning += event.delta));
    if (event.type === "response.output_text.delta") view.content((text += event.delta));
    const item = event.item;
    if (item && item.type === "mcp_call") {
      calls.set(item.id, { name: item.name, arguments: item.arguments,
        result: event.type === "response.output_item.done" ? (item.output ?? `Error: ${item.error && item.error.message}`) : undefined });
    }
    if (event.type === "response.mcp_call_arguments.delta") calls.get(event.item_id).arguments += event.delta;
    if (item || event.type === "response.mcp_call_arguments.delta") view.toolCalls([...calls.values()]);
    view.figures(figures(started, first, performance.now(), usage));
  });
  if (ended) view.figures(figures(started, first, performance.now(), usage));
  state.history.push({ role: "assistant", content: text });
  refresh();
}

async function reply(view) {
  if (state.tools.size) return replyWithTools(view);
  const started = performance.now();
  let first = null;
  let usage = null;
  let text = "";
  let reasoning = "";
  const calls = [];
  const ended = await streamed(view, "/v1/chat/completions", chatBody(), (chunk) => {
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
    if (!delta) return;
    if (first === null && (delta.content || delta.reasoning_content || delta.tool_calls)) first = performance.now();
    if (delta.reasoning_content) view.reasoning((reasoning += delta.reasoning_content));
    if (delta.content) view.content((text += delta.content));
    for (const call of delta.tool_calls || []) {
      const known = calls[call.index] || (calls[call.index] = { name: "", arguments: "" });
      known.name += (call.function && call.function.name) || "";
      known.arguments += (call.function && call.function.arguments) || "";
      view.toolCalls(calls);
    }
    view.figures(figures(started, first, performance.now(), usage));
  });
  if (ended) view.figures(figures(started, first, performance.now(), usage));
  state.history.push({ role: "assistant", content: text });
  refresh(); // the model may have been loaded for this reply
}

function attach() {
  for (const file of $("attach").files) addAttachment(file, file.name);
  $("attach").value = "";
}

function addAttachment(blob, name) {
  if (!MEDIA.includes(blob.type.split("/")[0])) {
    showBanner(`${name} is not an image, a video or an audio file.`);
    return;
  }
  const reader = new FileReader();
  reader.onload = () => {
    const attachment = { kind: blob.type.split("/")[0], url: reader.result, name };
    state.attachments.push(attachment);
    $("attachments").append(preview(attachment));
  };
  reader.readAsDataURL(blob);
}

// A voice note: the microphone recorded (the browser's own codec, Opus in WebM in
// Chromium) until the button is pressed again, then attached as an audio clip.
async function record() {
  if (state.recorder) {
    state.recorder.stop();
    return;
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
  } catch (error) {
    showBanner(`No microphone: ${error.message}`);
    return;
  }
  const recorder = new MediaRecorder(stream);
  const chunks = [];
  recorder.ondataavailable = (event) => chunks.push(event.data);
  recorder.onstop = () => {
    for (const track of stream.getTracks()) track.stop();
    state.recorder = null;
    $("record").textContent = "Record";
    addAttachment(new Blob(chunks, { type: recorder.mimeType }), "voice note");
  };
  state.recorder = recorder;
  recorder.start();
  $("record").textContent = "Stop recording";
}

// ---------------------------------------------------------------------------- models

const MEMORY_PARTS = [
  ["weights_bytes", "weights", "var(--weights)"],
  ["kv_cache_bytes", "KV caches", "var(--kv)"],
  ["prompt_cache_bytes", "prompt cache", "var(--cache)"],
];

function renderMemory(memory) {
  const used = MEMORY_PARTS.reduce((sum, [key]) => sum + memory[key], 0);
  const total = Math.max(memory.budget_bytes || used, 1);
  $("memory-bar").replaceChildren(...MEMORY_PARTS.map(([key, name, color]) => {
    const part = el("span", { title: `${name}: ${formatBytes(memory[key])}` });
    part.style.width = `${(100 * memory[key]) / total}%`;
    part.style.background = color;
    return part;
  }));
  const budget = memory.budget_bytes ? formatBytes(memory.budget_bytes) : "unbounded";
  $("memory-legend").replaceChildren(
    ...MEMORY_PARTS.map(([key, name, color]) => {
      const swatch = el("i");
      swatch.style.background = color;
      return el("span", {}, swatch, `${name} ${formatBytes(memory[key])}`);
    }),
    el("span", { textContent: `budget ${budget}` }),
  );
}

async function modelAction(path, body, button) {
  button.disabled = true;
  button.textContent = "…";
  try {
    await api(path, body);
  } catch (error) {
    showBanner(error.message);
    return;
  } finally {
    button.disabled = false;
  }
  await refresh();
}

function modelRow(model) {
  const loaded = model.state === "loaded";
  const actions = el("td");
  const action = (label, path, body) => {
    const button = el("button", { className: "quiet", textContent: label });
    button.dataset.action = label.toLowerCase();
    button.addEventListener("click", () => modelAction(path, body, button));
    actions.append(button);
  };
  if (loaded) action("Unload", "/v1/models/unload", { model: model.id });
  else action("Load", "/v1/models/load", { model: model.id });
  action(model.pinned ? "Unpin" : "Pin", "/v1/models/pin", { model: model.id, pinned: !model.pinned });
  if (model.kind === "adapter") action("Remove", "/v1/adapters/unload", { name: model.id });
  const kind = model.kind === "adapter" ? `adapter on ${model.base}` : model.kind;
  const row = el("tr", {},
    el("td", { textContent: model.id }),
    el("td", { textContent: kind }),
    el("td", { textContent: model.context_length ? model.context_length.toLocaleString() : "—" }),
    el("td", { textContent: formatBytes(model.size_bytes) }),
    el("td", { className: "state", textContent: loaded ? `yes (${formatBytes(model.memory_bytes)})` : "no" }),
    el("td", { className: "pinned", textContent: model.pinned ? "yes" : "no" }),
    actions);
  row.dataset.model = model.id;
  return row;
}

function renderModels(status) {
  renderMemory(status.memory);
  $("models-table").tBodies[0].replaceChildren(...status.models.map(modelRow));
  const base = $("adapter-base");
  const chosen = base.value;
  base.replaceChildren(...status.models.filter((m) => m.kind === "chat").map((m) => el("option", {
    value: m.id, textContent: m.id, selected: m.id === chosen,
  })));
}

async function loadAdapter(event) {
  event.preventDefault();
  const button = $("adapter-form").querySelector("button");
  const body = { name: $("adapter-name").value.trim(), path: $("adapter-path").value.trim() };
  if ($("adapter-base").value) body.model = $("adapter-base").value;
  await modelAction("/v1/adapters/load", body, button);
  button.textContent = "Load adapter";
}

// ---------------------------------------------------------------------------- status

function renderStatus(status) {
  $("running").textContent = status.requests.running;
  $("waiting").textContent = status.requests.waiting;
  $("rate").textContent = status.tokens_per_second.toFixed(1);
  $("sockets").textContent = status.websockets;
  $("recent-table").tBodies[0].replaceChildren(...status.recent.map((r) => el("tr", {},
    el("td", { textContent: r.request_id }),
    el("td", { textContent: r.path }),
    el("td", { textContent: r.model || "—" }),
    el("td", { textContent: r.status }),
    el("td", { textContent: `${r.prompt_tokens} (${r.cached_tokens})` }),
    el("td", { textContent: r.completion_tokens }),
    el("td", { textContent: seconds(r.ttft_seconds) }),
    el("td", { textContent: rate(r.tokens_per_second) }),
    el("td", { textContent: seconds(r.seconds) }))));
  renderBatches(status.batches);
  renderUsage(status.usage);
  renderMcp(status.mcp_servers);
}

// The MCP servers of --mcp-config, whose tools Responses requests may use.
function renderMcp(servers) {
  $("mcp-note").hidden = servers.length > 0;
  $("mcp-table").tBodies[0].replaceChildren(...servers.map((m) => el("tr", {},
    el("td", { textContent: m.name }),
    el("td", { textContent: m.transport }),
    el("td", { className: "state", textContent: m.state }),
    el("td", { textContent: m.tools.join(", ") || "—" }),
    el("td", { textContent: m.restarts }),
    el("td", { textContent: m.error || "—" }))));
}

// Today's use per API key and model (a key sees its own; an admin key, everyone's).
function renderUsage(usage) {
  $("usage-note").hidden = usage.length > 0;
  $("usage-table").tBodies[0].replaceChildren(...usage.map((u) => el("tr", {},
    el("td", { textContent: u.key }),
    el("td", { textContent: u.model || "—" }),
    el("td", { textContent: u.requests }),
    el("td", { textContent: `${u.prompt_tokens} (${u.cached_tokens})` }),
    el("td", { textContent: u.completion_tokens }),
    el("td", { textContent: u.audio_seconds.toFixed(1) }),
    el("td", { textContent: u.images }),
    el("td", { textContent: u.embedding_inputs }),
    el("td", { textContent: `${u.mcp_calls} (${u.mcp_seconds.toFixed(1)} s)` }))));
}

function when(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleString();
}

function renderBatches(batches) {
  $("batches-note").hidden = !batches.error;
  $("batches-note").textContent = batches.error || "";
  $("batches-table").tBodies[0].replaceChildren(...batches.jobs.map((b) => {
    const c = b.counts;
    const done = c.total - c.pending;
    const progress = el("progress", { max: c.total || 1, value: done });
    return el("tr", {},
      el("td", { textContent: b.id }),
      el("td", { textContent: b.api === "anthropic" ? "Anthropic" : "OpenAI" }),
      el("td", { textContent: b.endpoint }),
      el("td", { className: "state", textContent: b.status }),
      el("td", { className: "progress" }, progress, ` ${done} / ${c.total}`),
      el("td", { textContent: c.errored + c.canceled + c.expired }),
      el("td", { textContent: when(b.created_at) }));
  }));
  $("files-table").tBodies[0].replaceChildren(...batches.files.map((f) => el("tr", {},
    el("td", { textContent: f.id }),
    el("td", { textContent: f.filename }),
    el("td", { textContent: f.purpose }),
    el("td", { textContent: formatBytes(f.bytes) }),
    el("td", { textContent: when(f.created_at) }))));
}

// ---------------------------------------------------------------------------- start

function start() {
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showPage(tab.dataset.page));
  $("chat-form").addEventListener("submit", send);
  $("adapter-form").addEventListener("submit", loadAdapter);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) send(event);
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("attach").addEventListener("change", attach);
  $("record").addEventListener("click", record);
  $("talk").addEventListener("click", () => {
    if (state.talk) state.talk.stop();
    else state.talk = new Talk($("model-select").value, state.history, $("system-prompt").value.trim(), () => { state.talk = null; });
  });
  $("model-select").addEventListener("change", updateAttach);
  $("new-chat").addEventListener("click", () => {
    state.history = [];
    $("messages").replaceChildren();
  });
  $("key-button").addEventListener("click", () => {
    $("key-form").hidden = !$("key-form").hidden;
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem(KEY_STORE, $("key-input").value.trim());
    $("key-input").value = "";
    $("key-form").hidden = true;
    showBanner("");
    refresh();
  });
  showPage("chat");
}

start();
