// One native-protocol WebSocket (docs/protocol.md) that stays up: application-level keepalive
// (browsers cannot send WebSocket pings) and reconnect with capped, jittered exponential backoff.

const PING_EVERY_MS = 15000;
const PONG_MISSES = 2;                          // this many pings unanswered: the link is dead, reconnect
const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000];
const HEADER_BYTES = 16;

// Close codes after which trying again cannot help (the server said no on principle).
const FINAL_CLOSE = new Map([
  [1008, "The server refused the connection (policy: API key missing or wrong, or this page's origin is not allowed)."],
  [1003, "The server refused the data this page sent."],
]);

/** Parse a binary audio frame: 16-byte little-endian header + payload. */
export function parseAudioFrame(buffer) {
  if (buffer.byteLength < HEADER_BYTES) throw new Error(`binary frame of ${buffer.byteLength} bytes: shorter than its header`);
  const v = new DataView(buffer);
  return {
    version: v.getUint8(0),
    encoding: v.getUint8(1),
    stream: v.getUint32(4, true),
    seq: v.getUint32(8, true),
    startMs: v.getUint32(12, true),
    payload: new Uint8Array(buffer, HEADER_BYTES),
  };
}

export function defaultUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}/v1/ws`;
}

export class Connection {
  /**
   * handlers: onState(state, detail) with state one of "connecting", "open", "reconnecting",
   * "closed"; onMessage(msg) for JSON events; onAudio(frame) for binary frames; onRtt(ms).
   */
  constructor(handlers) {
    this.h = handlers;
    this.ws = null;
    this.url = "";
    this.apiKey = "";
    this.wanted = false;      // the person wants to be connected: reconnect after drops
    this.attempt = 0;
    this.retryTimer = null;
    this.pingTimer = null;
    this.pingId = 0;
    this.pingsOut = new Map();   // id -> performance.now() at send
  }

  connect(url, apiKey) {
    this.url = url;
    this.apiKey = apiKey;
    this.wanted = true;
    this.attempt = 0;
    this.open();
  }

  disconnect() {
    this.wanted = false;
    clearTimeout(this.retryTimer);
    this.teardown();
    if (this.ws) {
      this.ws.close(1000, "closed by the person");
      this.ws = null;
      this.h.onMessage({ type: "connection.lost" });
    }
    this.h.onState("closed", "Disconnected.");
  }

  get ready() { return this.ws !== null && this.ws.readyState === WebSocket.OPEN; }

  /** Send one JSON message; false when the socket is not open (the caller says so to the person). */
  send(msg) {
    if (!this.ready) return false;
    this.ws.send(JSON.stringify(msg));
    return true;
  }

  open() {
    clearTimeout(this.retryTimer);
    this.h.onState("connecting", `Connecting to ${this.url}…`);
    let ws;
    try {
      ws = new WebSocket(this.url);
    } catch (e) {
      this.wanted = false;
      this.h.onState("closed", `Cannot connect: ${e.message}`);
      return;
    }
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => {
      if (this.apiKey) ws.send(JSON.stringify({ type: "auth", api_key: this.apiKey }));
      // a ping at once: the round trip shows, and a server that needs a key says so now
      // (its first message must be `auth`) instead of waiting silently for one
      this.startKeepalive();
      this.pingNow();
    };
    ws.onmessage = (e) => {
      if (ws !== this.ws) return;
      if (typeof e.data === "string") this.onText(e.data);
      else this.h.onAudio(parseAudioFrame(e.data));
    };
    ws.onclose = (e) => {
      if (ws !== this.ws) return;      // an old socket, replaced already
      this.ws = null;
      this.teardown();
      this.h.onMessage({ type: "connection.lost" });
      const final = FINAL_CLOSE.get(e.code);
      if (final) this.wanted = false;
      if (!this.wanted) {
        this.h.onState("closed", final ? `${final}${e.reason ? ` (${e.reason})` : ""}` : "Disconnected.");
        return;
      }
      const base = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
      const delay = Math.round(base * (0.8 + 0.4 * Math.random()));
      this.attempt++;
      const why = e.reason ? `: ${e.reason}` : e.code === 1006 ? ": the connection dropped" : "";
      this.h.onState("reconnecting", `Connection closed (${e.code}${why}). Reconnecting in ${(delay / 1000).toFixed(1)} s…`);
      this.retryTimer = setTimeout(() => this.open(), delay);
    };
  }

  onText(text) {
    let msg;
    try {
      msg = JSON.parse(text);
    } catch {
      this.h.onMessage({ type: "error", code: "client_bad_json", message: "The server sent a message that is not JSON." });
      return;
    }
    if (msg.type === "session.ready") {
      this.attempt = 0;                 // a good session resets the backoff
      this.h.onState("open", "Connected.");
    } else if (msg.type === "pong") {
      const sent = this.pingsOut.get(msg.id);
      if (sent !== undefined) {
        this.pingsOut.clear();          // an answer proves the link: older pings no longer count
        this.h.onRtt(performance.now() - sent);
      }
      return;
    }
    this.h.onMessage(msg);
  }

  startKeepalive() {
    clearInterval(this.pingTimer);
    this.pingTimer = setInterval(() => {
      if (this.pingsOut.size >= PONG_MISSES) {     // no answer to the last pings: the link is dead
        this.ws.close(4000, "keepalive: no pong");
        this.ws.onclose({ code: 4000, reason: "no answer to keepalive pings" });
        return;
      }
      this.pingNow();
    }, PING_EVERY_MS);
  }

  pingNow() {
    const id = ++this.pingId;
    this.pingsOut.set(id, performance.now());
    this.send({ type: "ping", id });
  }

  teardown() {
    clearInterval(this.pingTimer);
    this.pingsOut.clear();
  }
}
