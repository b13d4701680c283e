// Send text the way a language model produces it: a first-token delay, then one word at a time at
// a steady rate. Timing is scheduled against absolute times so slow timers do not drift the rate.

const MAX_MESSAGE_CHARS = 2000;    // whole-text mode: well under the server's message size limit

/** Words with the whitespace before them, so joining the deltas gives back the text. */
export function wordDeltas(text) {
  return text.match(/\s*\S+/g) || [];
}

/** Whole-text mode: message-sized pieces, never splitting a surrogate pair. */
export function chunks(text) {
  const cps = Array.from(text);
  const out = [];
  for (let i = 0; i < cps.length; i += MAX_MESSAGE_CHARS) out.push(cps.slice(i, i + MAX_MESSAGE_CHARS).join(""));
  return out;
}

export class TextFeed {
  /** sendDelta(text) for each word; onDone() after the last one. */
  constructor(deltas, { wordsPerSecond, firstDelayMs, sendDelta, onDone }) {
    this.deltas = deltas;
    this.interval = 1000 / wordsPerSecond;
    this.sendDelta = sendDelta;
    this.onDone = onDone;
    this.i = 0;
    this.t0 = performance.now() + firstDelayMs;
    this.timer = setTimeout(() => this.tick(), firstDelayMs);
  }

  tick() {
    const now = performance.now();
    // catch up on words whose time has come (a throttled timer), but never send ahead of time
    while (this.i < this.deltas.length && now >= this.t0 + this.i * this.interval - 1) {
      this.sendDelta(this.deltas[this.i++]);
    }
    if (this.i >= this.deltas.length) {
      this.timer = null;
      this.onDone();
      return;
    }
    this.timer = setTimeout(() => this.tick(), Math.max(0, this.t0 + this.i * this.interval - performance.now()));
  }

  stop() {
    clearTimeout(this.timer);
    this.timer = null;
  }

  get running() { return this.timer !== null; }
}
