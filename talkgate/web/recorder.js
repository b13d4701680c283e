// Records a reference clip from the microphone for voice cloning: getUserMedia (no echo cancellation,
// noise suppression or gain control: the voice as it sounds) -> AudioWorklet (recorder-worklet.js) ->
// 16-bit mono WAV at the AudioContext's rate (the server resamples to 24 kHz). Stops by itself at
// MAX_SECONDS, the longest reference the server takes.

export const MAX_SECONDS = 30;

/** float32 samples -> a WAV file (16-bit PCM, mono) as a Blob. */
export function wavBlob(samples, rate) {
  const data = new DataView(new ArrayBuffer(44 + 2 * samples.length));
  const text = (at, s) => { for (let i = 0; i < s.length; i++) data.setUint8(at + i, s.charCodeAt(i)); };
  text(0, "RIFF"); data.setUint32(4, 36 + 2 * samples.length, true); text(8, "WAVE");
  text(12, "fmt "); data.setUint32(16, 16, true); data.setUint16(20, 1, true); data.setUint16(22, 1, true);
  data.setUint32(24, rate, true); data.setUint32(28, 2 * rate, true); data.setUint16(32, 2, true); data.setUint16(34, 16, true);
  text(36, "data"); data.setUint32(40, 2 * samples.length, true);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    data.setInt16(44 + 2 * i, s < 0 ? s * 0x8000 : s * 0x7fff, true);
  }
  return new Blob([data.buffer], { type: "audio/wav" });
}

export class Recorder {
  /** onTick(seconds) while recording; onStop(blob, seconds) when a recording ends (by stop() or the limit). */
  constructor({ onTick, onStop }) {
    this.onTick = onTick;
    this.onStop = onStop;
    this.ctx = null;
    this.node = null;
    this.stream = null;
    this.source = null;
    this.chunks = [];
    this.samples = 0;
    this.recording = false;
  }

  /** Start recording in `ctx` (an AudioContext, started inside the person's click). Throws a readable Error. */
  async start(ctx) {
    if (this.recording) return;
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error("This browser offers no microphone access here (it needs https or localhost).");
    }
    if (this.ctx !== ctx) {
      await ctx.audioWorklet.addModule(new URL("recorder-worklet.js", import.meta.url));
      this.ctx = ctx;
      this.node = new AudioWorkletNode(ctx, "talkgate-recorder", { numberOfOutputs: 1 });
      this.node.port.onmessage = (e) => this.take(e.data);
      const mute = new GainNode(ctx, { gain: 0 });        // pulled by the graph, heard by nobody
      this.node.connect(mute).connect(ctx.destination);
    }
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: false, noiseSuppression: false, autoGainControl: false, channelCount: 1 },
      });
    } catch (e) {
      throw new Error(e.name === "NotAllowedError" ? "Microphone permission was refused." : `Microphone unavailable: ${e.message}`);
    }
    this.source = ctx.createMediaStreamSource(this.stream);
    this.source.connect(this.node);
    this.chunks = [];
    this.samples = 0;
    this.recording = true;
    this.node.port.postMessage("start");
  }

  stop() {
    if (!this.recording) return;
    this.recording = false;
    this.node.port.postMessage("stop");      // answered by the last block, which ends the recording
  }

  take({ samples, last }) {
    const room = MAX_SECONDS * this.ctx.sampleRate - this.samples;
    const kept = samples.length > room ? samples.subarray(0, room) : samples;
    if (kept.length) { this.chunks.push(kept); this.samples += kept.length; }
    if (this.onTick) this.onTick(this.samples / this.ctx.sampleRate);
    if (this.recording && this.samples >= MAX_SECONDS * this.ctx.sampleRate) this.stop();
    if (!last) return;
    this.source.disconnect();
    for (const t of this.stream.getTracks()) t.stop();
    const all = new Float32Array(this.samples);
    let at = 0;
    for (const c of this.chunks) { all.set(c, at); at += c.length; }
    this.chunks = [];
    this.onStop(wavBlob(all, this.ctx.sampleRate), this.samples / this.ctx.sampleRate);
  }
}
