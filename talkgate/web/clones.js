// The cloned-voices card: the server's stored voices (GET /v1/audio/voices), a reference clip recorded from
// the microphone (recorder.js) or picked as a file, stored (POST /v1/audio/voices, multipart), used (put in
// the voice box: the next Speak speaks with it) and deleted. Figures for tests and people in `stats`.

import { MAX_SECONDS, Recorder } from "./recorder.js";

const $ = (id) => document.getElementById(id);
const CONSENT = "the speaker's consent was confirmed in the talkgate web page";

export class Clones {
  /**
   * base() -> the server's http(s) origin; apiKey() -> the key or ""; audioContext() -> a started
   * AudioContext (inside the click); onError({code, message}); useVoice(id) puts a voice in the voice box;
   * onVoices(list) with the stored voices (for the voice suggestions).
   */
  constructor({ base, apiKey, audioContext, onError, useVoice, onVoices }) {
    Object.assign(this, { base, apiKey, audioContext, onError, useVoice, onVoices });
    this.stats = { available: null, voices: [], recording: false, recordedSeconds: 0, clip: null, storing: false,
                   lastStored: null, deleted: 0 };
    this.clip = null;         // { blob, filename, source: "microphone" | "file", seconds }
    this.recorder = new Recorder({
      onTick: (s) => { this.stats.recordedSeconds = s; $("clone-seconds").value = `${s.toFixed(1)} s`; },
      onStop: (blob, seconds) => this.setClip(blob, "recording.wav", "microphone", seconds),
    });
  }

  wire() {
    $("clone-record").addEventListener("click", () => this.toggleRecording());
    $("clone-file").addEventListener("change", (e) => {
      const f = e.target.files && e.target.files[0];
      if (f) this.setClip(f, f.name, "file", null);
    });
    $("clone-form").addEventListener("submit", (e) => { e.preventDefault(); this.store(); });
    $("clone-list").addEventListener("click", (e) => {
      const b = e.target.closest("button[data-action]");
      if (!b) return;
      if (b.dataset.action === "use") this.useVoice(b.dataset.id);
      else this.remove(b.dataset.id, b.dataset.name);
    });
  }

  /** The chosen model (one of session.ready's models) says whether the card shows: a model that clones makes
   *  the voices stored here and speaks those it made (the list is the server's for this model). */
  setModel(model) {
    this.model = model.name;
    this.stats.available = model.clones === true;
    $("clone-card").hidden = !this.stats.available;
    for (const el of $("clone-form").elements) el.disabled = !this.stats.available;
    this.updateButton();
    if (!this.stats.available) {
      this.stats.voices = [];
      this.onVoices(this.stats.voices);
      return Promise.resolve();
    }
    return this.refresh();
  }

  headers() {
    const key = this.apiKey();
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  async request(method, path, body) {
    let r;
    try {
      r = await fetch(this.base() + path, { method, body, headers: this.headers() });
    } catch (e) {
      throw { code: "", message: `The server could not be reached: ${e.message}` };
    }
    const data = await r.json().catch(() => ({}));
    if (!r.ok) throw data.error || { code: `http_${r.status}`, message: `The server answered ${r.status}.` };
    return data;
  }

  async refresh() {
    try {
      const model = this.model;
      const data = await this.request("GET", `/v1/audio/voices?model=${encodeURIComponent(model)}`);
      if (model !== this.model) return;          // another model was chosen meanwhile: its own refresh answers
      this.stats.voices = data.voices.filter((v) => v.type === "cloned")
        .map((v) => ({ id: v.id, name: v.name, mode: v.mode, seconds: v.audio && v.audio.seconds }));
    } catch (e) {
      this.onError(e);
      return;
    }
    this.render();
    this.onVoices(this.stats.voices);
  }

  async toggleRecording() {
    if (this.recorder.recording) { this.recorder.stop(); return; }
    try {
      await this.recorder.start(await this.audioContext());
    } catch (e) {
      this.onError({ code: "", message: e.message });
      return;
    }
    this.stats.recording = true;
    $("clone-record").textContent = "Stop recording";
    $("clone-record").setAttribute("aria-pressed", "true");
    this.status(`Recording… (up to ${MAX_SECONDS} s; 5 to 15 s of clear speech works best)`);
  }

  setClip(blob, filename, source, seconds) {
    this.stats.recording = false;
    $("clone-record").textContent = "Record";
    $("clone-record").setAttribute("aria-pressed", "false");
    if (source === "microphone") $("clone-file").value = "";
    this.clip = { blob, filename, source, seconds };
    this.stats.clip = { source, filename, bytes: blob.size, seconds };
    const preview = $("clone-preview");
    if (preview.src) URL.revokeObjectURL(preview.src);
    preview.src = URL.createObjectURL(blob);
    preview.hidden = false;
    this.status(source === "microphone" ? `Recorded ${seconds.toFixed(1)} s.` : `Picked ${filename}.`);
    this.updateButton();
  }

  updateButton() {
    $("clone-store").disabled = !this.stats.available || !this.clip || this.stats.storing;
  }

  async store() {
    if (!this.clip) return;
    const form = new FormData();
    form.append("name", $("clone-name").value.trim());
    if ($("clone-text").value.trim()) form.append("ref_text", $("clone-text").value.trim());
    form.append("consent", CONSENT);
    form.append("model", this.model);          // the chosen model makes it (and speaks it)
    form.append("audio_sample", this.clip.blob, this.clip.filename);
    this.stats.storing = true;
    this.updateButton();
    this.status("Storing the voice…");
    try {
      const v = await this.request("POST", "/v1/audio/voices", form);
      this.status(`Stored “${v.name}” (${v.mode === "icl" ? "in-context" : "x-vector"}, ${v.audio.seconds.toFixed(1)} s): it is now the voice.`);
      await this.refresh();
      this.useVoice(v.id);
      // said last, once the list holds it and it is the voice: what watches lastStored sees all of that done
      this.stats.lastStored = { id: v.id, name: v.name, mode: v.mode, timing: v.timing };
    } catch (e) {
      this.status("The voice was not stored.");
      this.onError(e);
    } finally {
      this.stats.storing = false;
      this.updateButton();
    }
  }

  async remove(id, name) {
    try {
      await this.request("DELETE", `/v1/audio/voices/${encodeURIComponent(id)}`);
      this.stats.deleted++;
      this.status(`Deleted “${name}”.`);
    } catch (e) {
      this.onError(e);
    }
    await this.refresh();
  }

  status(text) { $("clone-status").textContent = text; }

  render() {
    const rows = this.stats.voices.map((v) => {
      const tr = document.createElement("tr");
      const seconds = v.seconds ? `${v.seconds.toFixed(1)} s` : "";
      for (const text of [v.name, v.mode === "icl" ? "in-context" : "x-vector", seconds]) {
        const td = document.createElement("td"); td.textContent = text; tr.append(td);
      }
      const td = document.createElement("td");
      for (const [action, label] of [["use", "Use"], ["delete", "Delete"]]) {
        const b = document.createElement("button");
        Object.assign(b, { type: "button", textContent: label });
        Object.assign(b.dataset, { action, id: v.id, name: v.name });
        b.setAttribute("aria-label", `${label} ${v.name}`);
        td.append(b);
      }
      tr.append(td);
      return tr;
    });
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = document.createElement("td");
      td.colSpan = 4; td.className = "hint"; td.textContent = "none stored yet";
      tr.append(td);
      rows.push(tr);
    }
    $("clone-list").replaceChildren(...rows);
  }
}
