// The audio player's page side: one AudioContext, one AudioWorklet ring buffer (player-worklet.js),
// and the decoders that feed it. PCM frames are converted here; Opus packets go through a WebCodecs
// AudioDecoder, one per stream, so a cancel can drop exactly that stream's pending output.

const CONTEXT_RATE = 48000;        // Opus decodes at 48 kHz; PCM 24 kHz is upsampled to match
const RING_SECONDS = 120;          // audio that may wait in the ring: a long utterance generated faster than real time
const OPUS_CONFIG = { codec: "opus", sampleRate: 48000, numberOfChannels: 1 };

export async function opusSupported() {
  if (typeof AudioDecoder === "undefined") return false;
  try {
    return (await AudioDecoder.isConfigSupported(OPUS_CONFIG)).supported === true;
  } catch {
    return false;
  }
}

/** Stateful linear-interpolation resampler: chunk boundaries are seamless. */
class LinearResampler {
  constructor(inRate, outRate) {
    this.step = inRate / outRate;
    this.pos = 0;      // position of the next output sample, in input samples, relative to `prev`
    this.prev = 0;     // last input sample of the previous chunk (virtual index 0)
  }

  process(x) {
    const n = x.length;
    if (n === 0) return x;
    const count = Math.max(0, Math.ceil((n - this.pos) / this.step));
    const y = new Float32Array(count);
    let t = this.pos;
    for (let i = 0; i < count; i++, t += this.step) {
      const k = Math.floor(t);
      const f = t - k;
      const a = k === 0 ? this.prev : x[k - 1];
      y[i] = a + (x[k] - a) * f;
    }
    this.pos = t - n;
    this.prev = x[n - 1];
    return y;
  }
}

function pcmToFloat(encoding, bytes) {
  if (encoding === 2) {           // pcm_s16le
    const n = bytes.byteLength >> 1;
    const view = new DataView(bytes.buffer, bytes.byteOffset, n * 2);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = view.getInt16(2 * i, true) / 32768;
    return out;
  }
  if (encoding === 3) {           // pcm_f32le
    const n = bytes.byteLength >> 2;
    const view = new DataView(bytes.buffer, bytes.byteOffset, n * 4);
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = view.getFloat32(4 * i, true);
    return out;
  }
  throw new Error(`encoding ${encoding} is not playable here`);
}

/**
 * One stream's decoder: PCM converted in place, Opus through WebCodecs. Calls `sink(samples, rate)`
 * with float32 mono samples in order.
 */
export class StreamDecoder {
  constructor(format, sink, onError) {
    this.format = format;
    this.sink = sink;
    this.closed = false;
    if (format.encoding === "opus") {
      this.decoder = new AudioDecoder({
        output: (data) => this.onAudioData(data),
        error: (e) => { if (!this.closed) onError(e); },
      });
      this.decoder.configure(OPUS_CONFIG);
    }
  }

  /** `encoding` is the binary header's code; `startMs` its start_ms. */
  decode(encoding, payload, startMs) {
    if (this.closed) return;
    if (encoding === 1) {
      this.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: startMs * 1000, data: payload }));
    } else {
      this.sink(pcmToFloat(encoding, payload), this.format.sample_rate);
    }
  }

  onAudioData(data) {
    if (this.closed) { data.close(); return; }
    const samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
    const rate = data.sampleRate;
    data.close();
    this.sink(samples, rate);
  }

  /** Resolves once every decoded sample has reached the sink. */
  async finish() {
    if (this.decoder && !this.closed && this.decoder.state === "configured") {
      try {
        await this.decoder.flush();
      } catch (e) {
        if (!this.closed) throw e;     // closed meanwhile by a cancel: its output is unwanted anyway
      }
    }
    this.close();
  }

  /** Drop pending output now (a cancel): nothing of this stream reaches the sink afterwards. */
  close() {
    if (this.closed) return;
    this.closed = true;
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
  }
}

export class Player {
  /** `onStats({bufferedMs, playedMs, underruns, overflowMs, playing})` every ~50 ms while playing. */
  constructor({ targetMs, onStats }) {
    this.targetMs = targetMs;
    this.onStats = onStats;
    this.ctx = null;
    this.node = null;
    this.analyser = null;
    this.resamplers = new Map();    // source rate -> LinearResampler, reset per utterance
    this.flushes = new Map();       // flush id -> resolve
    this.nextFlush = 1;
    this.starting = null;
  }

  /** Create the AudioContext (call from a user gesture: autoplay rules) and load the worklet. */
  start() {
    if (!this.starting) this.starting = this.init();
    return this.starting.then(() => (this.ctx.state === "suspended" ? this.ctx.resume() : undefined));
  }

  async init() {
    try {
      this.ctx = new AudioContext({ sampleRate: CONTEXT_RATE, latencyHint: "interactive" });
    } catch {
      this.ctx = new AudioContext({ latencyHint: "interactive" });   // resampled below to whatever rate it has
    }
    await this.ctx.audioWorklet.addModule(new URL("player-worklet.js", import.meta.url));
    this.node = new AudioWorkletNode(this.ctx, "talkgate-player", {
      numberOfInputs: 0, outputChannelCount: [1],
      processorOptions: { capacitySeconds: RING_SECONDS, targetMs: this.targetMs },
    });
    this.analyser = new AnalyserNode(this.ctx, { fftSize: 2048 });
    this.node.connect(this.analyser).connect(this.ctx.destination);
    this.node.port.onmessage = (e) => this.onMessage(e.data);
  }

  get sampleRate() { return this.ctx ? this.ctx.sampleRate : CONTEXT_RATE; }

  onMessage(msg) {
    const ms = (n) => (1000 * n) / this.ctx.sampleRate;
    if (msg.type === "stats") {
      this.onStats({ bufferedMs: ms(msg.buffered), playedMs: ms(msg.played), underruns: msg.underruns,
                     overflowMs: ms(msg.overflowed), playing: msg.playing });
    } else if (msg.type === "flushed") {
      const resolve = this.flushes.get(msg.id);
      this.flushes.delete(msg.id);
      if (resolve) resolve({ droppedMs: ms(msg.dropped), playedMs: ms(msg.played) });
    }
  }

  /** Start of an utterance: resampler state from the previous one must not leak into it. */
  newUtterance() { this.resamplers.clear(); }

  push(samples, rate) {
    if (!this.node) return;
    if (rate !== this.ctx.sampleRate) {
      let r = this.resamplers.get(rate);
      if (!r) this.resamplers.set(rate, (r = new LinearResampler(rate, this.ctx.sampleRate)));
      samples = r.process(samples);
    }
    this.node.port.postMessage({ type: "push", samples }, [samples.buffer]);
  }

  end() { if (this.node) this.node.port.postMessage({ type: "end" }); }

  setTarget(ms) {
    this.targetMs = ms;
    if (this.node) this.node.port.postMessage({ type: "target", ms });
  }

  /** Drop all buffered audio; once the worklet renders silence, resolves with {droppedMs, playedMs}. */
  flush() {
    if (!this.node) return Promise.resolve({ droppedMs: 0, playedMs: 0 });
    const id = this.nextFlush++;
    const done = new Promise((resolve) => this.flushes.set(id, resolve));
    this.node.port.postMessage({ type: "flush", id });
    return done;
  }
}
