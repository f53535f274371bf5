// examples/kiln_server_page.hpp - kiln-server's chat page (GET /): one self-contained HTML file, no
// external assets. It streams replies from /v1/chat/completions (fetch + Server-Sent Events), with a stop
// button (the request is aborted: the server frees the slot), a new conversation, temperature and max
// tokens, an API key field (for --api-key) and the reply's tokens/s (from the usage chunk).
#pragma once

namespace kiln_server {

inline constexpr const char* kChatPage = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>kiln chat</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 0; background: #f6f6f4; color: #222; }
  header { display: flex; gap: 1em; align-items: center; padding: .6em 1em; background: #2d2a26; color: #eee; flex-wrap: wrap; }
  header h1 { font-size: 1.1em; margin: 0; }
  header label { font-size: .85em; }
  header input { width: 5em; }
  #log { max-width: 50em; margin: 1em auto; padding: 0 1em 8em; }
  .msg { white-space: pre-wrap; padding: .6em .9em; border-radius: .6em; margin: .5em 0; line-height: 1.4; }
  .user { background: #dbe7f5; margin-left: 15%; }
  .assistant { background: #fff; border: 1px solid #ddd; margin-right: 15%; }
  .error { background: #f8d7d7; }
  .thinking { color: #888; font-style: italic; border-left: 3px solid #ddd; padding-left: .6em; margin-bottom: .5em; }
  .stats { font-size: .75em; color: #777; margin: -.3em 0 .6em; }
  form { position: fixed; bottom: 0; left: 0; right: 0; display: flex; gap: .5em; padding: .8em; background: #eee; border-top: 1px solid #ccc; }
  textarea { flex: 1; height: 3.2em; font: inherit; padding: .4em; }
  button { font: inherit; padding: 0 1em; }
</style></head>
<body>
<header><h1>kiln chat</h1><span id="model"></span>
  <label>temperature <input id="temp" type="number" min="0" max="2" step="0.1" value="0.7"></label>
  <label>max tokens <input id="maxtok" type="number" min="1" step="1" value="256"></label>
  <label>API key <input id="key" type="password" style="width:8em"></label>
  <button id="new" type="button">New conversation</button></header>
<div id="log"></div>
<form id="form"><textarea id="input" placeholder="Type a message; Enter sends, Shift+Enter breaks the line"></textarea>
  <button id="send" type="submit">Send</button><button id="stop" type="button" disabled>Stop</button></form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let messages = [], controller = null, conversation = 0;
function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
}
function add(role, text) {
  const d = document.createElement("div");
  d.className = "msg " + role;
  d.textContent = text;
  $("log").appendChild(d);
  window.scrollTo(0, document.body.scrollHeight);
  return d;
}
function busy(on) { $("send").disabled = on; $("stop").disabled = !on; }
async function send(text) {
  const mine = conversation;  // "New conversation" during the reply: the reply is not kept
  messages.push({ role: "user", content: text });
  add("user", text);
  const out = add("assistant", "");
  out.id = "reply-" + messages.length;
  const think = document.createElement("div"), answer = document.createElement("span");
  think.className = "thinking";  // the reasoning (delta.reasoning_content), apart from the answer
  think.hidden = true;
  out.append(think, answer);
  const stats = document.createElement("div");
  stats.className = "stats";
  $("log").appendChild(stats);
  controller = new AbortController();
  busy(true);
  const t0 = performance.now();
  let first = 0, reply = "", thinking = "", usage = null;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify({ messages, stream: true, stream_options: { include_usage: true },
                             temperature: Number($("temp").value), max_tokens: Number($("maxtok").value) }) });
    if (!r.ok) throw new Error((await r.json()).error.message);
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
        const j = JSON.parse(ev.slice(6));
        if (j.error) throw new Error(j.error.message);
        if (j.usage) usage = j.usage;
        const delta = (j.choices && j.choices[0] && j.choices[0].delta) || {};
        if (delta.reasoning_content) {
          if (!first) first = performance.now();
          thinking += delta.reasoning_content; think.textContent = thinking; think.hidden = false;
        }
        const piece = delta.content;
        if (piece) { if (!first) first = performance.now(); reply += piece; answer.textContent = reply; }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") { out.classList.add("error"); answer.textContent = reply + "\n[" + e.message + "]"; }
  }
  const t1 = performance.now();
  const n = usage ? usage.completion_tokens : 0;
  stats.textContent = first ? `${n ? n + " tokens, " : ""}first token ${(first - t0).toFixed(0)} ms` +
      (n > 1 ? `, ${((n - 1) / ((t1 - first) / 1000)).toFixed(1)} tokens/s` : "") +
      (usage ? `, prompt ${usage.prompt_tokens} (cached ${usage.prompt_tokens_details.cached_tokens})` : "") +
      (controller.signal.aborted ? " (stopped)" : "") : (controller.signal.aborted ? "stopped" : "");
  stats.id = "stats-" + messages.length;
  if (mine === conversation) messages.push({ role: "assistant", content: reply });
  controller = null;
  busy(false);
}
$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("new").addEventListener("click", () => { if (controller) controller.abort(); conversation++; messages = []; $("log").textContent = ""; });
fetch("/v1/models", { headers: headers() }).then((r) => r.json()).then((j) => { $("model").textContent = j.data[0].id; })
  .catch(() => {});
</script></body></html>
)HTML";

}  // namespace kiln_server
