// Microphone barge-in: the person starts talking while audio plays, so the page cancels it.
// Level = RMS of the microphone signal in dBFS (getUserMedia -> AnalyserNode). When it stays over
// the threshold for `holdMs` while audio is playing or being generated, `onBargeIn()` fires once;
// it can fire again only after the level has dropped below the threshold.

const CHECK_EVERY_MS = 20;     // setInterval, not requestAnimationFrame: keeps working in a background tab
const FLOOR_DB = -100;

export class BargeIn {
  /** isSpeaking() -> bool; onBargeIn(levelDb); onLevel(levelDb) for the meter. */
  constructor({ isSpeaking, onBargeIn, onLevel }) {
    this.isSpeaking = isSpeaking;
    this.onBargeIn = onBargeIn;
    this.onLevel = onLevel;
    this.thresholdDb = -35;
    this.holdMs = 150;
    this.stream = null;
    this.analyser = null;
    this.buf = null;
    this.timer = null;
    this.aboveMs = 0;
    this.armed = true;
    this.simulatedDb = null;    // test hook / demo: a level to use instead of the microphone's
  }

  get enabled() { return this.timer !== null; }

  /** Open the microphone in `audioCtx` and start watching. Throws a readable Error when refused. */
  async enable(audioCtx) {
    if (this.enabled) return;
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error("This browser offers no microphone access here (it needs https or localhost).");
    }
    try {
      // echo cancellation keeps the page's own playback from triggering a barge-in
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: false },
      });
    } catch (e) {
      throw new Error(e.name === "NotAllowedError" ? "Microphone permission was refused." : `Microphone unavailable: ${e.message}`);
    }
    const source = audioCtx.createMediaStreamSource(this.stream);
    this.analyser = new AnalyserNode(audioCtx, { fftSize: 1024 });
    this.buf = new Float32Array(this.analyser.fftSize);
    source.connect(this.analyser);      // not to the speakers: no feedback
    this.aboveMs = 0;
    this.armed = true;
    this.timer = setInterval(() => this.check(), CHECK_EVERY_MS);
  }

  disable() {
    clearInterval(this.timer);
    this.timer = null;
    if (this.stream) this.stream.getTracks().forEach((t) => t.stop());
    this.stream = null;
    this.analyser = null;
    this.onLevel(null);
  }

  level() {
    if (this.simulatedDb !== null) return this.simulatedDb;
    this.analyser.getFloatTimeDomainData(this.buf);
    let sum = 0;
    for (let i = 0; i < this.buf.length; i++) sum += this.buf[i] * this.buf[i];
    const rms = Math.sqrt(sum / this.buf.length);
    return rms > 0 ? Math.max(FLOOR_DB, 20 * Math.log10(rms)) : FLOOR_DB;
  }

  check() {
    const db = this.level();
    this.onLevel(db);
    if (db <= this.thresholdDb) {
      this.aboveMs = 0;
      this.armed = true;
      return;
    }
    this.aboveMs += CHECK_EVERY_MS;
    if (this.armed && this.aboveMs >= this.holdMs && this.isSpeaking()) {
      this.armed = false;
      this.onBargeIn(db);
    }
  }
}
