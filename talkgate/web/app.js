// The talkgate page: wires the controls to the native protocol (connection.js), the audio player
// (player.js), the LLM-style text feed (textfeed.js) and microphone barge-in (bargein.js), and
// shows live figures. One utterance plays at a time: speaking again cancels the one before.
//
// window.talkgateStats holds every figure the page shows (tests and people can read it), and
// window.talkgate.snapshot() a plain copy of it; window.talkgate.setMicLevel(db) feeds a microphone
// level instead of the real one (null: the real one again), for tests and demos.

import { BargeIn } from "./bargein.js";
import { Clones } from "./clones.js";
import { Connection, defaultUrl } from "./connection.js";
import { Player, StreamDecoder, opusSupported } from "./player.js";
import { TextFeed, chunks, wordDeltas } from "./textfeed.js";

const MAX_UTTERANCES = 20;     // kept in stats (the table shows the newest 8)
const MAX_ERRORS = 5;

const $ = (id) => document.getElementById(id);

// Error codes of docs/protocol.md in words a person can act on; the server's message follows.
const ERROR_WORDS = {
  invalid_json: "The server could not read a message from this page.",
  invalid_message: "The server rejected a message from this page.",
  unknown_type: "The server does not know a message this page sent.",
  binary_not_allowed: "The server does not accept binary messages.",
  message_too_large: "A message from this page was too large for the server.",
  unknown_context: "The server no longer knows that utterance.",
  context_exists: "An utterance with that id is already running.",
  context_closed: "That utterance already has all its text.",
  unknown_voice: "The server has no voice of that name.",
  unknown_language: "The model does not speak that language.",
  invalid_format: "The server cannot produce that audio format.",
  invalid_params: "A setting is out of range.",
  text_too_long: "The text is longer than the server allows for one utterance.",
  too_many_contexts: "Too many utterances at once on this connection.",
  engine_full: "The server is busy right now: try again in a moment.",
  slow_consumer: "This page fell behind receiving audio, so the server stopped the utterance.",
  unauthorized: "The server needs a valid API key.",
  idle_timeout: "The connection was idle for too long, so the server closed it.",
  internal_error: "The server hit an internal error.",
  engine_stopped: "The server's speech engine has stopped.",
  decode_error: "This browser could not decode the audio.",
  invalid_voice: "That voice cannot be spoken by the chosen model.",
  cloning_unavailable: "The chosen model cannot clone voices.",
  unknown_model: "The server does not serve that model.",
  voice_exists: "A stored voice has that name already.",
  voice_not_found: "The server has no such stored voice.",
  invalid_name: "The voice needs a name (at most 100 characters).",
  invalid_audio: "The clip is not audio the server can read.",
  unsupported_audio_format: "The server cannot read that audio format: use WAV, FLAC, Ogg or MP3.",
  audio_too_short: "The clip is too short: record at least 1 second.",
  audio_too_long: "The clip is too long: at most 30 seconds.",
  audio_too_large: "The clip is larger than the server takes (10 MB).",
  audio_silent: "The clip is silent: check the microphone.",
  reference_text_too_long: "The words spoken are longer than the server takes.",
  missing_audio: "Record or pick a clip first.",
  client_bad_json: "The server sent something this page cannot read.",
};

const stats = {
  state: "closed",
  sessionId: null,
  rttMs: null,
  pongs: 0,                 // keepalive answers on this page
  framesReceived: 0,
  staleFramesDropped: 0,
  decodedSamples: 0,        // samples out of the decoders (at their source rate)
  receivedMs: 0,            // audio handed to the player
  playedMs: 0,              // audio the worklet has rendered
  bufferMs: 0,
  underruns: 0,
  overflowMs: 0,
  playing: false,
  ttfaClientMs: null,       // last utterance: first text sent -> first audio frame received
  ttfaServerMs: null,       // last utterance: the server's timing.ttfa_ms
  cancelToSilenceMs: null,  // last cancel: click / barge-in -> worklet rendering silence
  bargeIns: 0,
  utterances: [],
  errors: [],
  model: null,              // the chosen model (one of models)
  models: [],               // the served models, from session.ready
  limits: null,
};
window.talkgateStats = stats;

const conn = new Connection({ onState, onMessage, onAudio, onRtt: (ms) => { stats.rttMs = ms; stats.pongs++; } });
const player = new Player({
  targetMs: Number($("jitter").value),
  onStats: (s) => {
    stats.bufferMs = s.bufferedMs; stats.playedMs = s.playedMs; stats.underruns = s.underruns;
    stats.overflowMs = s.overflowMs; stats.playing = s.playing;
  },
});
const bargeIn = new BargeIn({
  isSpeaking: () => live.size > 0 || stats.playing || stats.bufferMs > 0,
  onBargeIn: () => { stats.bargeIns++; stop("barge-in"); },
  onLevel: showMicLevel,
});
const clones = new Clones({
  base: () => { const u = new URL($("url").value, location.href); return `${u.protocol === "wss:" ? "https:" : "http:"}//${u.host}`; },
  apiKey: () => $("api-key").value,
  audioContext: async () => { await player.start(); return player.ctx; },
  onError: showError,
  useVoice: (id) => { $("voice").value = id; },
  onVoices: () => setVoiceSuggestions(),
});
stats.clones = clones.stats;
window.talkgate = {
  stats,
  /** A plain copy of the figures (without the live decoder and feed objects). */
  snapshot: () => JSON.parse(JSON.stringify(stats, (k, v) => (k === "decoder" || k === "feed" ? undefined : v))),
  setMicLevel: (db) => { bargeIn.simulatedDb = db; },
};

const live = new Map();       // context_id -> utterance still expecting server events
const byStream = new Map();   // stream -> utterance whose audio is wanted (others are stale)
let nextUtterance = 1;

// ----- connection -----
function onState(state, detail) {
  stats.state = state;
  const pill = $("conn-state");
  pill.dataset.state = state;
  pill.textContent = detail;
  $("speak").disabled = state !== "open";
  $("connect").disabled = state === "open" || state === "connecting";
  if (state !== "open") stats.rttMs = null;
}

function onMessage(msg) {
  switch (msg.type) {
    case "session.ready": return onReady(msg);
    case "context.started": return onStarted(msg);
    case "timing": return onTiming(msg);
    case "context.done": return onDone(msg);
    case "context.cancelled": return onCancelled(msg);
    case "error": return onError(msg);
    case "connection.lost": return onLost();
    default: return undefined;     // session.configured and future events: nothing to show
  }
}

function onReady(msg) {
  // the served models (session.ready's `models`: each one's voices, languages, whether it clones), the default first
  stats.models = msg.models || [{ ...msg.model, default: true }];
  stats.sessionId = msg.session_id;
  stats.limits = msg.limits;
  const pick = $("model-pick");
  const keep = pick.value;
  pick.replaceChildren(...stats.models.map((m) => Object.assign(document.createElement("option"),
    { value: m.name, textContent: `${m.name}: ${m.model_type} ${m.size}${m.default ? " (default)" : ""}` })));
  const chosen = stats.models.find((m) => m.name === keep) || stats.models.find((m) => m.default) || stats.models[0];
  pick.value = chosen.name;
  chooseModel(chosen.name);
}

/** The model that speaks: its figures, its voices and languages, and the clone card when it clones. */
function chooseModel(name) {
  const m = stats.models.find((x) => x.name === name);
  stats.model = m;
  const banner = $("untrained");
  banner.hidden = !m.untrained;
  $("untrained-notice").textContent = m.notice || "random untrained weights: the audio is noise, not speech";
  const rows = [["name", m.name], ["checkpoint", m.checkpoint], ["type", m.model_type], ["size", m.size],
                ["device", `${m.device} / ${m.dtype}, decoder ${m.decoder_dtype}`], ["sample rate", `${m.sample_rate} Hz`],
                ["voices", m.voices.length ? m.voices.join(", ") : m.clones ? "cloned (stored below)" : "none (instructions)"],
                ["weights", m.untrained ? "UNTRAINED (random)" : "trained"], ["session", stats.sessionId]];
  const dl = $("model");
  dl.replaceChildren();
  for (const [k, v] of rows) {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    dl.append(dt, dd);
  }
  // a voice of another model leaves the box (a stored voice stays: the server says if this model cannot speak it)
  const voice = $("voice").value.trim().toLowerCase();
  if (voice && !m.voices.includes(voice) && stats.models.some((x) => x.voices.includes(voice))) $("voice").value = "";
  setVoiceSuggestions();
  clones.setModel(m);
  const lang = $("language");
  const keep = lang.value;
  lang.replaceChildren(...m.languages.map((l) => Object.assign(document.createElement("option"), { value: l, textContent: l })));
  lang.value = m.languages.includes(keep) ? keep : "auto";
  updateCount();
}

/** The voice box's suggestions: the model's voices, then the stored ones (their id, labelled by name). */
function setVoiceSuggestions() {
  const own = (stats.model ? stats.model.voices : []).map((v) => Object.assign(document.createElement("option"), { value: v }));
  const stored = (clones.stats.available ? clones.stats.voices : []).map((v) => Object.assign(document.createElement("option"), { value: v.id, label: `${v.name} (cloned)` }));
  $("voices").replaceChildren(...own, ...stored);
}

// ----- utterances -----
function newUtterance(mode) {
  const u = {
    id: `u${nextUtterance++}`, mode, stream: null, format: null, decoder: null, feed: null,
    started: false, pending: [], flushWanted: false,
    tFirstText: null, ttfaClientMs: null, ttfaServerMs: null, receivedMs: 0, frames: 0,
    outcome: "starting", cancelToSilenceMs: null, audioMsSent: null, serverAudioMs: null,
  };
  stats.utterances.push(u);
  if (stats.utterances.length > MAX_UTTERANCES) stats.utterances.shift();
  live.set(u.id, u);
  return u;
}

function chosenFormat() {
  const [encoding, rate] = $("format").value.split("/");
  return { encoding, sample_rate: Number(rate) };
}

// Text waits for context.started: if the start is refused (unknown voice...), no text may start a
// context with the default settings instead.
function sendText(u, text) {
  if (!live.has(u.id)) return;
  if (u.tFirstText === null) u.tFirstText = performance.now();
  if (u.started) conn.send({ type: "text", context_id: u.id, text });
  else u.pending.push(text);
}

function sendFlush(u) {
  if (!live.has(u.id)) return;
  if (u.started) conn.send({ type: "flush", context_id: u.id });
  else u.flushWanted = true;
}

async function speak() {
  const text = $("text").value;
  if (!text.trim()) return showError({ code: "", message: "Type some text to speak first." });
  if (!conn.ready || stats.state !== "open") return showError({ code: "", message: "Not connected to the server yet." });
  const starting = player.start();          // inside the click: browsers allow audio from a gesture
  stop("replaced");
  $("error").hidden = true;                 // a new attempt: the last error stays in the list below
  await starting;
  const mode = document.querySelector("input[name=mode]:checked").value;
  const u = newUtterance(mode);
  const start = { type: "context.start", context_id: u.id, format: chosenFormat() };
  if (stats.models && stats.models.length > 1) start.model = stats.model.name;
  u.model = stats.model ? stats.model.name : null;
  const voice = $("voice").value.trim();
  if (voice) start.voice = voice;
  u.voice = voice || null;
  if ($("language").value !== "auto") start.language = $("language").value;
  if ($("instructions").value.trim()) start.instructions = $("instructions").value.trim();
  // sent as typed: the server judges the range (invalid_params, shown in words)
  if ($("frames").value.trim()) start.fixed_frames = Number($("frames").value);
  conn.send(start);
  player.newUtterance();
  if (mode === "whole") {
    for (const piece of chunks(text)) sendText(u, piece);
    sendFlush(u);
  } else {
    u.feed = new TextFeed(wordDeltas(text), {
      wordsPerSecond: Math.max(0.5, Number($("wps").value) || 6),
      firstDelayMs: Math.max(0, Number($("first-delay").value) || 0),
      sendDelta: (d) => sendText(u, d),
      onDone: () => sendFlush(u),
    });
  }
  return undefined;
}

function onStarted(msg) {
  const u = live.get(msg.context_id);
  if (!u) return;
  u.started = true;
  u.stream = msg.stream;
  u.format = msg.format;
  u.outcome = "speaking";
  u.decoder = new StreamDecoder(msg.format, (samples, rate) => {
    stats.decodedSamples += samples.length;
    const ms = (1000 * samples.length) / rate;
    stats.receivedMs += ms;
    u.receivedMs += ms;
    player.push(samples, rate);
  }, (e) => showError({ code: "decode_error", message: String(e && e.message ? e.message : e), context_id: u.id }));
  byStream.set(u.stream, u);
  for (const t of u.pending) conn.send({ type: "text", context_id: u.id, text: t });
  u.pending = [];
  if (u.flushWanted) conn.send({ type: "flush", context_id: u.id });
}

function onAudio(frame) {
  stats.framesReceived++;
  const u = byStream.get(frame.stream);
  if (!u) { stats.staleFramesDropped++; return; }     // a cancelled (or unknown) stream: drop it
  if (u.ttfaClientMs === null) {
    u.ttfaClientMs = performance.now() - u.tFirstText;
    stats.ttfaClientMs = u.ttfaClientMs;
  }
  u.frames++;
  try {
    u.decoder.decode(frame.encoding, frame.payload, frame.startMs);
  } catch (e) {
    showError({ code: "decode_error", message: e.message, context_id: u.id });
  }
}

function onTiming(msg) {
  const u = live.get(msg.context_id);
  if (!u) return;
  u.ttfaServerMs = msg.ttfa_ms;
  stats.ttfaServerMs = msg.ttfa_ms;
}

async function onDone(msg) {
  const u = live.get(msg.context_id);
  if (!u) return;
  u.serverAudioMs = msg.audio_ms;
  live.delete(u.id);
  await u.decoder.finish();      // the last Opus packets reach the player before the tail is played out
  u.outcome = `done (${msg.reason})`;
  byStream.delete(u.stream);
  if (live.size === 0) player.end();
}

function onCancelled(msg) {
  const u = stats.utterances.find((x) => x.id === msg.context_id);
  if (u) u.audioMsSent = msg.audio_ms_sent;
}

function onError(msg) {
  // a message that crossed the end of its utterance on the wire (a flush after a fatal error): not news
  if (msg.code === "unknown_context" && !live.has(msg.context_id)
      && stats.utterances.some((x) => x.id === msg.context_id)) return;
  showError(msg);
  const u = msg.context_id ? live.get(msg.context_id) : undefined;
  // a refused start (never started) or a fatal error ends the utterance; other errors leave it running
  if (u && (msg.fatal || !u.started)) endUtterance(u, `error: ${msg.code}`);
}

function endUtterance(u, outcome) {
  u.outcome = outcome;
  if (u.feed) u.feed.stop();
  if (u.decoder) u.decoder.close();
  live.delete(u.id);
  byStream.delete(u.stream);
  if (live.size === 0) player.end();
}

function onLost() {
  for (const u of [...live.values()]) endUtterance(u, "connection lost");
}

/** Stop everything now: cancel every context on the server and silence playback. `t0`: when the
 * person acted (an event's timeStamp), so cancel -> silence includes the page's own delay. */
function stop(reason, t0 = performance.now()) {
  const cancelled = [...live.values()];
  for (const u of cancelled) {
    if (u.feed) u.feed.stop();
    u.outcome = reason;
    live.delete(u.id);
  }
  // also utterances that are done but whose decoder is still emitting its last samples
  for (const u of byStream.values()) u.decoder.close();
  byStream.clear();
  if (cancelled.length) conn.send({ type: "cancel" });   // no context_id: all of them (barge-in)
  const wasPlaying = stats.playing || stats.bufferMs > 0 || cancelled.length > 0;
  player.flush().then(({ playedMs }) => {
    if (!wasPlaying) return;
    const ms = performance.now() - t0;
    stats.playedMs = playedMs;       // exact at the moment of silence (stats reports lag up to 50 ms)
    stats.cancelToSilenceMs = ms;
    for (const u of cancelled) u.cancelToSilenceMs = ms;
  });
}

// ----- errors -----
function showError(msg) {
  const words = ERROR_WORDS[msg.code] || (msg.code ? "The server reported a problem." : "");
  const text = [words, msg.message].filter(Boolean).join(" ");
  const entry = { code: msg.code || "", message: msg.message || "", text, context_id: msg.context_id || null };
  stats.errors.push(entry);
  if (stats.errors.length > MAX_ERRORS) stats.errors.shift();
  const box = $("error");
  box.hidden = false;
  box.textContent = text + (msg.context_id ? ` (utterance ${msg.context_id})` : "");
  const list = $("errors");
  list.replaceChildren(...stats.errors.slice().reverse().map((e) => {
    const li = document.createElement("li");
    li.append(e.text);
    if (e.code) {
      const code = document.createElement("code");
      code.textContent = ` [${e.code}]`;
      li.append(code);
    }
    return li;
  }));
}

// ----- figures -----
const fmtMs = (v) => (v === null || v === undefined ? "–" : `${v.toFixed(v < 10 ? 1 : 0)} ms`);

function render() {
  $("s-ttfa-client").textContent = fmtMs(stats.ttfaClientMs);
  $("s-ttfa-server").textContent = fmtMs(stats.ttfaServerMs);
  $("s-buffer").textContent = `${fmtMs(stats.bufferMs)}${stats.playing ? " (playing)" : ""}`;
  $("s-underruns").textContent = String(stats.underruns);
  $("s-audio").textContent = `${Math.round(stats.receivedMs)} / ${Math.round(stats.playedMs)} ms`
    + (stats.overflowMs > 0 ? ` (${Math.round(stats.overflowMs)} ms lost: buffer full)` : "");
  $("s-cancel").textContent = fmtMs(stats.cancelToSilenceMs);
  $("s-stale").textContent = String(stats.staleFramesDropped);
  $("s-bargeins").textContent = String(stats.bargeIns);
  $("s-rtt").textContent = fmtMs(stats.rttMs);
  const rows = stats.utterances.slice(-8).reverse().map((u) => {
    const tr = document.createElement("tr");
    for (const v of [u.id, fmtMs(u.ttfaClientMs), fmtMs(u.ttfaServerMs), `${Math.round(u.receivedMs)} ms`, u.outcome]) {
      const td = document.createElement("td"); td.textContent = v; tr.append(td);
    }
    return tr;
  });
  $("utterances").replaceChildren(...rows);
}

function drawWave() {
  const canvas = $("wave");
  const g = canvas.getContext("2d");
  const css = getComputedStyle(document.documentElement);
  let data = null;
  const frame = () => {
    const w = canvas.width, h = canvas.height;
    g.clearRect(0, 0, w, h);
    g.strokeStyle = css.getPropertyValue("--accent") || "#1f5fbf";
    g.lineWidth = 1.5;
    g.beginPath();
    if (player.analyser) {
      if (!data) data = new Float32Array(player.analyser.fftSize);
      player.analyser.getFloatTimeDomainData(data);
      for (let i = 0; i < data.length; i++) {
        const x = (i / (data.length - 1)) * w;
        const y = h / 2 - Math.max(-1, Math.min(1, data[i])) * (h / 2 - 2);
        if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
      }
    } else {
      g.moveTo(0, h / 2); g.lineTo(w, h / 2);
    }
    g.stroke();
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}

function showMicLevel(db) {
  $("mic-level").value = db === null ? -90 : Math.max(-90, db);
  $("mic-db").textContent = db === null ? "off" : `${db.toFixed(0)} dBFS`;
}

function updateCount() {
  const n = Array.from($("text").value).length;
  const max = stats.limits ? stats.limits.max_text_chars : null;
  const out = $("text-count");
  out.textContent = max ? `${n} / ${max} characters` : `${n} characters`;
  out.classList.toggle("over", max !== null && n > max);
}

// ----- controls -----
async function setMic(on) {
  if (!on) { bargeIn.disable(); return; }
  try {
    await player.start();
    await bargeIn.enable(player.ctx);
  } catch (e) {
    $("mic").checked = false;
    showError({ code: "", message: e.message });
  }
}

function wire() {
  $("url").value = defaultUrl();
  clones.wire();
  $("model-pick").addEventListener("change", () => chooseModel($("model-pick").value));
  $("speak-form").addEventListener("submit", (e) => { e.preventDefault(); speak(); });
  $("stop").addEventListener("click", (e) => stop("stopped", e.timeStamp));
  $("text").addEventListener("input", updateCount);
  $("text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); speak(); }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape") stop("stopped", e.timeStamp);
  });
  $("conn-form").addEventListener("submit", (e) => { e.preventDefault(); conn.connect($("url").value, $("api-key").value); });
  $("disconnect").addEventListener("click", () => conn.disconnect());
  $("jitter").addEventListener("change", () => player.setTarget(Math.max(0, Number($("jitter").value) || 0)));
  $("mic").addEventListener("change", () => setMic($("mic").checked));
  const threshold = $("threshold");
  const setThreshold = () => {
    bargeIn.thresholdDb = Number(threshold.value);
    $("threshold-out").textContent = threshold.value;
    $("mic-level").low = Number(threshold.value);
  };
  threshold.addEventListener("input", setThreshold);
  $("hold").addEventListener("change", () => { bargeIn.holdMs = Math.max(20, Number($("hold").value) || 150); });
  setThreshold();
  updateCount();
  setInterval(render, 100);
  drawWave();
}

async function main() {
  wire();
  const canOpus = await opusSupported();
  const opus = $("format").querySelector('option[value="opus/48000"]');
  if (!canOpus) {
    opus.disabled = true;
    opus.textContent += ": not supported by this browser";
    $("format").value = "pcm_s16le/24000";
  }
  conn.connect($("url").value, "");
}

main();
