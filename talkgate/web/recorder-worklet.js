// AudioWorklet of the reference-clip recorder (recorder.js): hands the microphone's first channel to the
// page in blocks of BLOCK samples while recording is on; outputs silence.

const BLOCK = 4096;

class TalkgateRecorder extends AudioWorkletProcessor {
  constructor() {
    super();
    this.on = false;
    this.buf = new Float32Array(BLOCK);
    this.n = 0;
    this.port.onmessage = (e) => {
      if (e.data === "start") { this.on = true; this.n = 0; }
      if (e.data === "stop") {
        this.on = false;
        this.port.postMessage({ samples: this.buf.slice(0, this.n), last: true });
        this.n = 0;
      }
    };
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!this.on || !input) return true;
    for (let i = 0; i < input.length; i++) {
      this.buf[this.n++] = input[i];
      if (this.n === BLOCK) {
        this.port.postMessage({ samples: this.buf, last: false });
        this.buf = new Float32Array(BLOCK);
        this.n = 0;
      }
    }
    return true;
  }
}

registerProcessor("talkgate-recorder", TalkgateRecorder);
