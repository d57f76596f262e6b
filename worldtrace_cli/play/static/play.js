// worldtrace play: the page's side of the live protocol (worldtrace_cli/play/server.py).
"use strict";
const $ = (id) => document.getElementById(id);
const S = {
  ws: null, ready: false, paused: false, inflight: false, fps: 25,
  waiting: true,        // the world waits for the first key or drag (ready.wait_for_key; --start-running: false)
  waitForKey: true,     // whether a new session (load, Reset) waits for a key
  pausedMs: 0, pausedAt: null,  // time spent paused so far (ms), and since when the page is paused
  keyPausedMs: 0,       // pausedSoFar() when the held keys last changed: key-to-frame leaves pauses out
  held: new Set(), drag: null, dragDx: 0, dragDy: 0,
  queue: [],            // frames waiting to be shown: {imgs: [lane0, lane1], truth, first, sent}
  keyChangedAt: null,   // when the held keys last changed (performance.now(), ms)
  drawn: [],            // times of the frames drawn in the last second
  psnr: [[], []], timeline: [[], []], lanes: [],
  latencies: [], fpsSamples: [], serverTimes: [],  // key-to-frame seconds and displayed fps once a second (benchmarks)
};
const KEYS = new Set(["w", "a", "s", "d", "arrowleft", "arrowright", "arrowup", "arrowdown"]);

function status(text, error) { const el = $("status"); el.textContent = text; el.className = error ? "error" : ""; }

function action() {
  const h = S.held, words = [];
  if (h.has("w") !== h.has("s")) words.push(h.has("w") ? "forward" : "back");
  if (h.has("a") !== h.has("d")) words.push(h.has("a") ? "left" : "right");
  const yaw = (h.has("arrowright") ? 1 : 0) - (h.has("arrowleft") ? 1 : 0) + Math.sign(Math.trunc(S.dragDx / 12));
  const pitch = (h.has("arrowup") ? 1 : 0) - (h.has("arrowdown") ? 1 : 0) - Math.sign(Math.trunc(S.dragDy / 12));
  if (yaw) words.push(yaw > 0 ? "camera_r" : "camera_l");
  if (pitch && S.mode === "universal") words.push(pitch > 0 ? "camera_up" : "camera_down");
  return words.join("+") || "idle";
}

function pausedSoFar(now) { return S.pausedMs + (S.pausedAt === null ? 0 : now - S.pausedAt); }

function keyChanged() {
  // a key or drag: note when (key-to-frame), and the first one starts the world
  const now = performance.now();
  S.keyChangedAt = now; S.keyPausedMs = pausedSoFar(now);
  if (S.waiting && (!S.text || S.prompt)) { S.waiting = false; if (S.ready) status(S.paused ? "paused" : "running"); }
}

function send(obj) { if (S.ws && S.ws.readyState === 1) S.ws.send(JSON.stringify(obj)); }

function pump() {
  // ask for the next chunk while the current one plays: at most one chunk of frames waits
  if (!S.ready || S.waiting || S.paused || S.inflight || S.queue.length > 12) return;
  S.inflight = true;
  S.sent = { at: performance.now(), keyAt: S.keyChangedAt, keyPausedMs: S.keyPausedMs };
  S.keyChangedAt = null;
  const a = action();
  S.dragDx = 0; S.dragDy = 0;
  send(S.text ? { op: "step", prompt: S.prompt } : { op: "step", action: a });
}

function image(b64) { const img = new Image(); img.src = "data:image/jpeg;base64," + b64; return img; }

function onChunk(msg) {
  S.inflight = false;
  const n = msg.lanes[0].frames.length;
  for (let i = 0; i < n; i++) {
    S.queue.push({ imgs: msg.lanes.map((l) => image(l.frames[i])), truth: msg.truth ? image(msg.truth[i]) : null,
                   first: i === 0 ? S.sent : null });
  }
  $("chunk").textContent = msg.chunk; $("action").textContent = msg.action;
  $("made").textContent = msg.server_s.toFixed(2);
  S.serverTimes.push(msg.server_s);
  msg.lanes.forEach((lane, i) => {
    S.psnr[i].push(lane.gt_psnr);
    S.timeline[i].push({ slots: lane.slots, events: lane.events, self: lane.self });
    drawTimeline(i); drawAttention(i); slotTable(i, lane.slots);
  });
  const fmt = (v) => (v === null || v === undefined ? "-" : v.toFixed(2));
  $("psnr0").textContent = fmt(msg.lanes[0].gt_psnr);
  $("psnr1").textContent = msg.lanes[1] ? ` | ${fmt(msg.lanes[1].gt_psnr)}` : "";
  drawPsnr();
  pump();
}

function drawFrame() {
  const now = performance.now();
  const item = S.queue.shift();
  if (item) {
    [$("gen0"), $("gen1")].forEach((c, i) => { if (item.imgs[i]) paint(c, item.imgs[i]); });
    if (item.truth) paint($("truth"), item.truth);
    if (item.first && item.first.keyAt !== null) {
      // from the key to its first frame on screen, less any time spent paused in between
      const latency = (now - item.first.keyAt - (pausedSoFar(now) - item.first.keyPausedMs)) / 1000;
      S.latencies.push(latency);  // read by benchmarks/play_latency.py
      $("latency").textContent = latency.toFixed(2);
    }
    S.drawn.push(now);
  }
  while (S.drawn.length && S.drawn[0] < now - 1000) S.drawn.shift();
  $("fps").textContent = S.drawn.length;
  if (!S.paused && (!S.lastSample || now - S.lastSample >= 1000)) { S.fpsSamples.push(S.drawn.length); S.lastSample = now; }
  pump();
}

function paint(canvas, img) {
  const draw = () => { canvas.width = img.naturalWidth; canvas.height = img.naturalHeight; canvas.getContext("2d").drawImage(img, 0, 0); };
  if (img.complete) draw(); else img.onload = draw;
}

// viridis, five stops
const VIR = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function viridis(t) {
  t = Math.max(0, Math.min(1, t)) * (VIR.length - 1);
  const i = Math.min(VIR.length - 2, Math.floor(t)), f = t - i;
  return `rgb(${VIR[i].map((v, k) => Math.round(v + f * (VIR[i + 1][k] - v))).join(",")})`;
}

function drawTimeline(lane) {
  const c = $("timeline" + lane), g = c.getContext("2d"), cols = S.timeline[lane].slice(-64);
  g.clearRect(0, 0, c.width, c.height);
  const rows = Math.max(1, ...cols.map((x) => x.slots.length));
  const top = 14, w = c.width / Math.max(16, cols.length), h = (c.height - top) / rows;
  const maxFrame = Math.max(1, 3 * S.timeline[lane].length);
  cols.forEach((col, x) => {
    const off = rows - col.slots.length;  // newest slot at the bottom, as cache_timeline.png
    col.slots.forEach((s, y) => {
      g.fillStyle = s.mean === null ? "#333" : viridis(s.mean / maxFrame);
      g.fillRect(x * w + 1, top + (off + y) * h + 1, w - 2, h - 2);
      if (s.role === "summary") { g.strokeStyle = "#fbbf24"; g.strokeRect(x * w + 1.5, top + (off + y) * h + 1.5, w - 3, h - 3); }
    });
    col.events.forEach((e) => {
      g.fillStyle = e.type === "landmark" ? "#ef4444" : "#f59e0b";
      g.beginPath();
      if (e.type === "landmark") { g.moveTo(x * w + w / 2, 2); g.lineTo(x * w + w / 2 - 5, 12); g.lineTo(x * w + w / 2 + 5, 12); }
      else g.arc(x * w + w / 2, 7, 4, 0, 2 * Math.PI);
      g.fill();
    });
  });
}

// inferno, five stops: the attention shares (dark = not read, bright = read most)
const INF = [[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]];
function inferno(t) {
  t = Math.max(0, Math.min(1, t)) * (INF.length - 1);
  const i = Math.min(INF.length - 2, Math.floor(t)), f = t - i;
  return `rgb(${INF[i].map((v, k) => Math.round(v + f * (INF[i + 1][k] - v))).join(",")})`;
}

function shareScale() {
  // the colour scale's top, one for both lanes (so a writer's dark cache reads as dark beside the other's):
  // the largest share a past slot got so far (the chunk's own share saturates)
  let top = 1e-6;
  S.timeline.forEach((cols) => cols.forEach((col) => col.slots.forEach((s) => {
    if (s.share !== null && s.share !== undefined) top = Math.max(top, s.share);
  })));
  return top;
}

function drawAttention(lane) {
  // slots x chunks coloured by each slot's share of the chunk's attention, and the chunk's own share as
  // the last row (--attention-stats; the server's default in play)
  const c = $("attn" + lane), g = c.getContext("2d"), all = S.timeline[lane], cols = all.slice(-64);
  g.clearRect(0, 0, c.width, c.height);
  const measured = all.some((col) => col.self !== null && col.self !== undefined);
  document.querySelectorAll(".attn").forEach((el) => { el.hidden = !measured && !S.attention; });
  if (!measured) return;
  S.attention = true;
  const rows = Math.max(1, ...cols.map((x) => x.slots.length)) + 1;
  const w = c.width / Math.max(16, cols.length), h = c.height / rows, top = shareScale();
  cols.forEach((col, x) => {
    const off = rows - 1 - col.slots.length;
    col.slots.forEach((s, y) => {
      g.fillStyle = s.share === null || s.share === undefined ? "#333" : inferno(s.share / top);
      g.fillRect(x * w + 1, (off + y) * h + 1, w - 2, h - 2);
    });
    if (col.self !== null && col.self !== undefined) {
      g.fillStyle = inferno(col.self / top);
      g.fillRect(x * w + 1, (rows - 1) * h + 1, w - 2, h - 2);
    }
  });
  S.attnGeometry = S.attnGeometry || [];
  S.attnGeometry[lane] = { w, h, rows, first: all.length - cols.length };
}

function slotTable(lane, slots) {
  const body = $("slots" + lane);
  body.innerHTML = "";
  const top = shareScale();
  slots.forEach((s, i) => {
    const tr = document.createElement("tr");
    tr.className = s.role;
    const frames = s.frames.join(",") + (s.n > s.frames.length ? ` (+${s.n - s.frames.length})` : "");
    [s.role, s.kind, frames, s.vpos].forEach((v) => { const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); });
    const td = document.createElement("td");
    td.className = "attn";
    if (s.share !== null && s.share !== undefined) {
      const bar = document.createElement("span");
      bar.className = "share"; bar.style.width = `${Math.round(60 * s.share / top)}px`;
      td.appendChild(bar); td.appendChild(document.createTextNode(s.share.toFixed(3)));
    }
    tr.appendChild(td);
    tr.onmouseenter = tr.onclick = () => showSlot(lane, s, i);
    body.appendChild(tr);
  });
}

function showSlot(lane, slot, index) {
  // hovering or tapping a slot: the frame it holds (the server sends the generated one and the truth)
  if (!slot || slot.still === null || slot.still === undefined) return;
  const key = `${lane}:${slot.still}`;
  $("preview").hidden = false;
  const share = slot.share === null || slot.share === undefined ? "" : `, share ${slot.share.toFixed(3)}`;
  const many = slot.n > 1 ? ` (averages ${slot.n} frames: the one nearest their mean)` : "";
  $("previewlabel").textContent = `lane ${lane + 1}, slot ${index}: ${slot.role} ${slot.kind}${share}`;
  $("previewnote").textContent = `latent frame ${slot.still}${many}; left generated, right the true view`;
  if (S.previewKey === key) return;
  S.previewKey = key;
  send({ op: "frame", lane, latent_frame: slot.still });
}

function attnHover(lane, ev) {
  const geo = (S.attnGeometry || [])[lane];
  if (!geo) return;
  const rect = ev.target.getBoundingClientRect();
  const x = Math.floor((ev.clientX - rect.left) * (ev.target.width / rect.width) / geo.w);
  const y = Math.floor((ev.clientY - rect.top) * (ev.target.height / rect.height) / geo.h);
  const col = S.timeline[lane][geo.first + x];
  if (!col) return;
  const i = y - (geo.rows - 1 - col.slots.length);
  if (i >= 0 && i < col.slots.length) showSlot(lane, col.slots[i], i);
}
for (const lane of [0, 1]) {
  $("attn" + lane).addEventListener("mousemove", (ev) => attnHover(lane, ev));
  $("attn" + lane).addEventListener("click", (ev) => attnHover(lane, ev));
}

function drawPsnr() {
  const c = $("psnr"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const all = S.psnr.flat().filter((v) => v !== null && v !== undefined);
  if (!all.length) {
    g.fillStyle = "#888";
    g.fillText(S.truth === false ? "no ground truth for this session"
      : S.psnr[0].length ? "no GT-PSNR in this session (--metrics none)" : "GT-PSNR appears with the first chunk", 10, 20);
    return;
  }
  const lo = Math.floor(Math.min(...all) - 1), hi = Math.ceil(Math.max(...all) + 1), n = Math.max(8, S.psnr[0].length);
  g.fillStyle = "#888"; g.fillText(`${hi} dB`, 2, 10); g.fillText(`${lo} dB`, 2, c.height - 2);
  ["#60a5fa", "#f472b6"].forEach((colour, lane) => {
    const ys = S.psnr[lane];
    g.strokeStyle = colour; g.lineWidth = 2; g.beginPath();
    ys.forEach((v, i) => {
      if (v === null) return;
      const x = 40 + (i / (n - 1)) * (c.width - 50), y = c.height - 4 - ((v - lo) / (hi - lo)) * (c.height - 12);
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    });
    g.stroke();
    if (S.lanes[lane]) { g.fillStyle = colour; g.fillText(S.lanes[lane].writer, c.width - 90, 12 + 12 * lane); }
  });
}

function setLanes(lanes) {
  S.lanes = lanes;
  $("label0").textContent = `${lanes[0].writer}  (${lanes[0].run_dir || "not recorded"})`;
  $("writer").value = lanes[0].writer;
  const two = lanes.length > 1;
  $("lane1panel").hidden = !two; $("cache1panel").hidden = !two;
  if (two) $("label1").textContent = `${lanes[1].writer}  (${lanes[1].run_dir || "not recorded"})`;
  // each lane's history comes with it (a replayed writer has its own)
  S.psnr = [0, 1].map((i) => (lanes[i] ? lanes[i].psnr : []));
  S.timeline = [0, 1].map((i) => (lanes[i] ? lanes[i].timeline : []));
  lanes.forEach((l, i) => { drawTimeline(i); drawAttention(i); slotTable(i, l.timeline.length ? l.timeline[l.timeline.length - 1].slots : []); });
  S.previewKey = null;
  drawPsnr();
  S.queue = [];
}

function connect() {
  const ws = new WebSocket(`ws://${location.host}/ws`);
  S.ws = ws;
  ws.onmessage = (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.op === "ready") {
      S.ready = true; S.fps = msg.fps; S.mode = msg.mode; S.truth = msg.truth; S.text = msg.mode === "text";
      $("promptbar").hidden = !S.text;  // a text-to-video preset: prompts instead of keys
      if (S.text) {
        $("help").textContent = "type a prompt, Enter: the video starts; a new prompt switches the scene · space pauses";
        $("keys").hidden = true; $("actionlabel").textContent = "prompt";
      }
      $("preset").textContent = `${msg.preset} (${msg.mode})`;
      msg.writers.forEach((w) => { for (const id of ["writer", "compare"]) { const o = document.createElement("option"); o.value = o.textContent = w; $(id).appendChild(o); } });
      $("truthpanel").hidden = !msg.truth;
      setLanes(msg.lanes);
      setInterval(drawFrame, 1000 / S.fps);
      S.waitForKey = msg.wait_for_key !== false;
      S.waiting = S.waitForKey && S.waiting;
      if (S.text && !S.prompt) S.waiting = true;  // a text session's first chunk needs a prompt
      status(S.waiting ? (S.text ? "ready: the video waits for your first prompt"
        : "ready: the world waits for your first key (hold W to walk)") : "running");
      pump();
    } else if (msg.op === "chunk") onChunk(msg);
    else if (msg.op === "lanes") { S.inflight = false; setLanes(msg.lanes); status(`writers: ${msg.lanes.map((l) => l.writer).join(" | ")}`); pump(); }
    else if (msg.op === "frame") {
      $("previewgen").src = "data:image/jpeg;base64," + msg.generated;
      $("previewtruth").hidden = !msg.truth;
      if (msg.truth) $("previewtruth").src = "data:image/jpeg;base64," + msg.truth;
    }
    else if (msg.op === "status") status(msg.message);
    else if (msg.op === "saved") status(`saved (in --runs-dir): ${msg.folders.join(", ")}`);
    else if (msg.op === "error") { S.inflight = false; status(msg.message, true); }
  };
  ws.onclose = () => { S.ready = false; status("disconnected from the server (reload to start a new session)", true); };
}

function keyName(ev) { return ev.key.toLowerCase(); }
function setPrompt() {
  // a text-to-video session: the next chunks read this prompt (the first one starts the video)
  const p = $("prompt").value.trim();
  if (!p) { status("type a prompt first", true); return; }
  S.prompt = p; keyChanged(); status(`prompt: ${p}`);
}
$("setprompt").onclick = setPrompt;
document.addEventListener("keydown", (ev) => {
  if (ev.target && ev.target.tagName === "INPUT") { if (ev.key === "Enter") setPrompt(); return; }  // typing a prompt
  const k = keyName(ev);
  if (k === " ") { togglePause(); ev.preventDefault(); return; }
  if (!KEYS.has(k) || S.held.has(k)) return;
  S.held.add(k); keyChanged(); hud(); ev.preventDefault();
});
document.addEventListener("keyup", (ev) => {
  const k = keyName(ev);
  if (!S.held.delete(k)) return;
  keyChanged(); hud();
});
window.addEventListener("blur", () => { S.held.clear(); hud(); });
function hud() { document.querySelectorAll(".key").forEach((el) => el.classList.toggle("on", S.held.has(el.dataset.k))); }

for (const id of ["gen0", "gen1", "truth"]) {
  $(id).addEventListener("mousedown", (ev) => { S.drag = { x: ev.clientX, y: ev.clientY }; ev.preventDefault(); });
}
document.addEventListener("mousemove", (ev) => {
  if (!S.drag) return;
  S.dragDx += ev.clientX - S.drag.x; S.dragDy += ev.clientY - S.drag.y;
  S.drag = { x: ev.clientX, y: ev.clientY };
  if (S.keyChangedAt === null || S.waiting) keyChanged();
});
document.addEventListener("mouseup", () => { S.drag = null; });

function togglePause() {
  const now = performance.now();
  if (S.paused) { S.pausedMs += now - S.pausedAt; S.pausedAt = null; } else S.pausedAt = now;
  S.paused = !S.paused; $("pause").textContent = S.paused ? "Resume" : "Pause";
  status(S.paused ? "paused" : S.waiting ? "the world waits for your first key" : "running"); pump();
}
$("pause").onclick = togglePause;
$("save").onclick = () => send({ op: "save" });
$("reset").onclick = () => { S.queue = []; S.waiting = S.waitForKey; send({ op: "reset" }); };
$("writer").onchange = (ev) => { S.inflight = true; send({ op: "writer", cache: ev.target.value }); };
$("compare").onchange = (ev) => { S.inflight = true; send({ op: "compare", cache: ev.target.value || null }); };
connect();
