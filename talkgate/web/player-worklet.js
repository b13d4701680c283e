// The audio player's render side: one ring buffer of mono float32 samples at the AudioContext's
// rate, with a jitter buffer in front of playback. Runs on the audio thread; talks to the page only
// through its message port (player.js). Every PCM and Opus stream ends up here.
//
// Messages in:  {type: "push", samples: Float32Array}   append audio (already at sampleRate)
//               {type: "end"}                            no more audio for now: play out the tail
//               {type: "flush", id}                      drop everything now (cancel / barge-in)
//               {type: "target", ms}                     jitter buffer target
// Messages out: {type: "stats", ...}                     every ~50 ms while anything changes
//               {type: "flushed", id, dropped, played}   first render quantum after a flush (silence from here on)

const REPORT_SECONDS = 0.05;
const FADE_SAMPLES = 64;   // a flush fades out over ~1.3 ms instead of clicking

class PlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions;
    this.ring = new Float32Array(Math.round(opts.capacitySeconds * sampleRate));
    this.readPos = 0;
    this.size = 0;                 // buffered samples
    this.target = Math.round((opts.targetMs * sampleRate) / 1000);
    this.playing = false;          // false: priming, waiting for the jitter target
    this.ended = true;             // true: no more audio expected, so play the tail without priming
    this.played = 0;               // samples played since the page loaded
    this.underruns = 0;
    this.overflowed = 0;           // samples dropped because the ring was full
    this.flushId = null;           // a flush to confirm at the next render quantum
    this.flushDropped = 0;
    this.sinceReport = 0;
    this.dirty = true;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  onMessage(msg) {
    this.dirty = true;
    if (msg.type === "push") {
      this.write(msg.samples);
      this.ended = false;
    } else if (msg.type === "end") {
      this.ended = true;
    } else if (msg.type === "flush") {
      this.flushId = msg.id;
    } else if (msg.type === "target") {
      this.target = Math.round((msg.ms * sampleRate) / 1000);
    }
  }

  write(samples) {
    const cap = this.ring.length;
    let n = samples.length;
    if (n > cap - this.size) {
      this.overflowed += n - (cap - this.size);
      n = cap - this.size;
    }
    let w = (this.readPos + this.size) % cap;
    const first = Math.min(n, cap - w);
    this.ring.set(samples.subarray(0, first), w);
    if (n > first) this.ring.set(samples.subarray(first, n), 0);
    this.size += n;
  }

  readInto(out, count) {
    const cap = this.ring.length;
    const first = Math.min(count, cap - this.readPos);
    out.set(this.ring.subarray(this.readPos, this.readPos + first), 0);
    if (count > first) out.set(this.ring.subarray(0, count - first), first);
    this.readPos = (this.readPos + count) % cap;
    this.size -= count;
    this.played += count;
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    out.fill(0);
    if (this.flushId !== null) {
      // fade out what would have played, then drop the rest: silence from the next quantum on
      const n = Math.min(FADE_SAMPLES, this.playing ? this.size : 0);
      if (n > 0) {
        this.readInto(out, n);
        for (let i = 0; i < n; i++) out[i] *= 1 - i / n;
      }
      this.flushDropped = this.size;
      this.readPos = (this.readPos + this.size) % this.ring.length;
      this.size = 0;
      this.playing = false;
      this.ended = true;
      this.port.postMessage({ type: "flushed", id: this.flushId, dropped: this.flushDropped, played: this.played });
      this.flushId = null;
      this.dirty = true;
    } else {
      if (!this.playing && this.size > 0 && (this.size >= this.target || this.ended)) this.playing = true;
      if (this.playing) {
        const n = Math.min(out.length, this.size);
        this.readInto(out, n);
        if (this.size === 0) {
          this.playing = false;
          if (!this.ended) this.underruns++;     // ran dry mid-utterance: prime again before resuming
        }
        this.dirty = true;
      }
    }
    this.sinceReport += out.length;
    if (this.dirty && this.sinceReport >= REPORT_SECONDS * sampleRate) {
      this.sinceReport = 0;
      this.dirty = false;
      this.port.postMessage({
        type: "stats", buffered: this.size, played: this.played, underruns: this.underruns,
        overflowed: this.overflowed, playing: this.playing,
      });
    }
    return true;
  }
}

registerProcessor("talkgate-player", PlayerProcessor);
