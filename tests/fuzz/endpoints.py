"""Every endpoint of the server as the fuzzer drives it, and the rules its answers are judged by.

An `Endpoint` knows its URL, what its error looks like (native `error` event, ElevenLabs `{"error"}`,
Cartesia `type: error`, Deepgram a close with a reason or a `Warning`, Deepgram Flux `Error` or
`ConfigureFailure`, DashScope an `error` event) and its *probe*: a message whose
answer is recognisable and arrives after the answer to everything sent before it (answers are written
in order), so the frames between an input and the probe's answer are that input's answer:

    native, Twilio    {"type": "ping", "id": "probe-N"}             -> pong with that id
    ElevenLabs multi  {"context_id": "probeN", "close_context": true} -> a message naming probeN
    Cartesia          an empty context "probe-N", ended at once      -> done (or error) naming it
    Deepgram          {"type": "ProbeN"} (an unknown type)           -> a Warning naming it
    Deepgram Flux     {"type": "Configure", "speed": 100+N}           -> ConfigureFailure with that value
                      (an Error closes /v2/speak; a refused Configure is answered and the socket lives on)
    DashScope         {"type": "probe.N"} (an unknown event)          -> an error event naming it
    ElevenLabs single (one utterance per socket: no probe; a short window, judged per script)

`judge` applies the rules to one input's answer: never a hang, never a close without a reason (a close
with 1000 and no error after a bad message is silent), never 1011 or `internal_error` for a client's
mistake, every text frame strict JSON (no NaN), native events valid against docs/protocol.schema.json,
and a known-bad input always answered with the protocol's error.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
SCHEMA = json.loads((DOCS / "protocol.schema.json").read_text())
STREAM_SID = "MZ00000000000000000000000000000000"
CARTESIA_VOICE = {"mode": "id", "id": "ryan"}
CARTESIA_PCM = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
SERVER_FAULT_CODES = {"engine_full", "engine_error", "engine_stopped", "shutting_down"}   # not the client's mistake


def native_error_codes() -> set[str]:
    """The error codes docs/protocol.md documents (its "Error codes" section)."""
    text = (DOCS / "protocol.md").read_text()
    section = text.split("## Error codes", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([a-z_]+)`", section))


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity (RFC 8259 has no such numbers)."""
    return json.loads(text, parse_constant=_reject_constant)


def _validator():
    import jsonschema
    return jsonschema.Draft202012Validator({**SCHEMA, "oneOf": [{"$ref": "#/$defs/server"}]})


# ----- what came back -----
@dataclass
class Reply:
    items: list = field(default_factory=list)   # dict (JSON text frame), bytes (binary), str (not strict JSON)
    close: tuple[int | None, str] | None = None  # the server ended the connection: (close code, reason)
    abrupt: bool = False                         # ... without a close frame
    answered: bool = False                       # the probe's answer arrived
    timed_out: bool = False

    def jsons(self) -> list[dict]:
        return [i for i in self.items if isinstance(i, dict)]

    def brief(self) -> str:
        shown = []
        for i in self.items:
            if isinstance(i, bytes):
                if not shown or shown[-1] != "<audio>":
                    shown.append("<audio>")
            elif isinstance(i, dict) and isinstance(i.get("audio"), str):
                if not shown or shown[-1] != "<audio>":
                    shown.append("<audio>")
            elif isinstance(i, dict) and i.get("event") == "media":
                if not shown or shown[-1] != "<audio>":
                    shown.append("<audio>")
            elif isinstance(i, dict) and i.get("type") in ("chunk", "response.audio.delta"):
                if not shown or shown[-1] != "<audio>":
                    shown.append("<audio>")
            else:
                shown.append(json.dumps(i)[:160] if isinstance(i, dict) else f"NOT-JSON {i[:80]!r}")
        end = ("timeout" if self.timed_out else "") + (f" close={self.close}" if self.close else "") + \
              (" (no close frame)" if self.abrupt else "")
        return f"{' '.join(shown)[:600]}{end}"


# ----- endpoints -----
class Endpoint:
    name = ""
    label = ""                  # the protocol label of talkgate_connections
    greeting: str | None = None  # the "type" of the message the server sends on connect, if any
    json_audio = False

    def path(self, **query) -> str:
        raise NotImplementedError

    def is_error(self, item) -> bool:
        raise NotImplementedError

    def problems(self, item) -> list[str]:
        """What is wrong with one of its server messages."""
        return []

    def probe(self, n: int) -> str | None:
        return None

    def answers_probe(self, item, n: int) -> bool:
        return False

    def refusal_problem(self, status: int, body: bytes) -> str | None:
        """What is wrong with an HTTP answer to the upgrade (the connection refused before it), or None: a 4xx
        in talkgate's JSON error shape."""
        if not 400 <= status < 500:
            return f"upgrade answered HTTP {status}: {body[:120]!r}"
        try:
            error = json.loads(body).get("error")
            assert isinstance(error, dict) and isinstance(error.get("code"), str)
        except (ValueError, AssertionError, AttributeError):
            return f"upgrade refused with HTTP {status} but not a JSON error: {body[:120]!r}"
        return None


class Native(Endpoint):
    name, label, greeting = "native /v1/ws", "native", "session.ready"
    codes: set[str] = set()
    validator = None

    def path(self, **query) -> str:
        return "/v1/ws" + _query(query)

    def is_error(self, item) -> bool:
        return isinstance(item, dict) and item.get("type") == "error"

    def problems(self, item) -> list[str]:
        if not isinstance(item, dict) or "type" not in item:
            return []
        if Native.validator is None:
            Native.validator, Native.codes = _validator(), native_error_codes()
        out = [f"not valid against docs/protocol.schema.json: {e.message[:160]}"
               for e in list(Native.validator.iter_errors(item))[:1]]
        if item.get("type") == "error":
            if item.get("code") == "internal_error":
                out.append("internal_error answered to a client's input")
            elif item.get("code") not in Native.codes:
                out.append(f"error code {item.get('code')!r} is not documented in docs/protocol.md")
        return out

    def probe(self, n: int) -> str:
        return json.dumps({"type": "ping", "id": f"probe-{n}"})

    def answers_probe(self, item, n: int) -> bool:
        return isinstance(item, dict) and item.get("type") == "pong" and item.get("id") == f"probe-{n}"


class Twilio(Native):
    name, label = "twilio /v1/twilio", "twilio"

    def path(self, **query) -> str:
        return "/v1/twilio" + _query({"stream_sid": STREAM_SID, **query})

    def problems(self, item) -> list[str]:
        if isinstance(item, dict) and "event" in item:
            if item.get("streamSid") != STREAM_SID:
                return [f"Twilio frame for another stream: {item}"]
            return []
        return super().problems(item)


class ElevenLabs(Endpoint):
    label = "elevenlabs"
    json_audio = True

    def __init__(self, multi: bool):
        self.multi = multi
        self.name = "elevenlabs " + ("multi-stream-input" if multi else "stream-input")

    def path(self, voice: str = "ryan", **query) -> str:
        kind = "multi-stream-input" if self.multi else "stream-input"
        return f"/v1/text-to-speech/{voice}/{kind}" + _query({"output_format": "pcm_24000", **query})

    def is_error(self, item) -> bool:
        return isinstance(item, dict) and "error" in item

    def problems(self, item) -> list[str]:
        if self.is_error(item):
            out = []
            if not isinstance(item.get("error"), str) or not isinstance(item.get("message"), str):
                out.append(f"malformed error {item}")
            if item.get("error") == "internal_error":
                out.append("internal_error answered to a client's input")
            return out
        return []

    def probe(self, n: int) -> str | None:
        return json.dumps({"context_id": f"probe{n}", "close_context": True}) if self.multi else None

    def answers_probe(self, item, n: int) -> bool:
        return isinstance(item, dict) and item.get("contextId") == f"probe{n}" and not item.get("audio")


class Cartesia(Endpoint):
    name, label = "cartesia /tts/websocket", "cartesia"
    json_audio = True

    def path(self, **query) -> str:
        return "/tts/websocket" + _query({"cartesia_version": "2025-04-16", **query})

    def is_error(self, item) -> bool:
        return isinstance(item, dict) and item.get("type") == "error"

    def problems(self, item) -> list[str]:
        if not self.is_error(item):
            return []
        out = []
        code, status = item.get("error_code"), item.get("status_code")
        if code == "internal_error":
            out.append("internal_error answered to a client's input")
        if isinstance(status, int) and status >= 500 and code not in SERVER_FAULT_CODES:
            out.append(f"status_code {status} for a client's mistake ({code})")
        if item.get("done") is not True or not isinstance(item.get("message"), str):
            out.append(f"malformed error {item}")
        return out

    def probe(self, n: int) -> str:
        return json.dumps({"context_id": f"probe-{n}", "model_id": "sonic-2", "transcript": "", "continue": False,
                           "voice": CARTESIA_VOICE, "output_format": CARTESIA_PCM})

    def answers_probe(self, item, n: int) -> bool:
        return isinstance(item, dict) and item.get("context_id") == f"probe-{n}" and item.get("type") in ("done", "error")


class Deepgram(Endpoint):
    name, label, greeting = "deepgram /v1/speak", "deepgram", "Metadata"

    def path(self, **query) -> str:
        return "/v1/speak" + _query({"model": "aura-2-thalia-en", "encoding": "linear16", "sample_rate": "24000",
                                     **query})

    def is_error(self, item) -> bool:
        return isinstance(item, dict) and item.get("type") in ("Warning", "Error")

    def probe(self, n: int) -> str:
        return json.dumps({"type": f"Probe{n}"})

    def answers_probe(self, item, n: int) -> bool:
        return self.is_error(item) and f"Probe{n}" in json.dumps(item)


class DeepgramV2(Endpoint):
    """Flux TTS. An `Error` is followed by a close, so the probe is a `Configure` whose speed is out of range,
    answered with a `ConfigureFailure` naming the value while the socket lives on."""
    name, label, greeting = "deepgram /v2/speak", "deepgram_v2", "Connected"
    PROBE_SPEED = 100

    def path(self, **query) -> str:
        return "/v2/speak" + _query({"model": "flux-alexis-en", "encoding": "linear16", "sample_rate": "24000",
                                     **query})

    def is_error(self, item) -> bool:
        return isinstance(item, dict) and item.get("type") in ("Error", "ConfigureFailure")

    def problems(self, item) -> list[str]:
        if not self.is_error(item):
            return []
        out = []
        if not isinstance(item.get("code"), str) or not isinstance(item.get("description"), str):
            out.append(f"malformed {item.get('type')} {item}")
        if item.get("code") == "internal_error":
            out.append("internal_error answered to a client's input")
        return out

    def probe(self, n: int) -> str:
        return json.dumps({"type": "Configure", "speed": self.PROBE_SPEED + n})

    def answers_probe(self, item, n: int) -> bool:
        return (isinstance(item, dict) and item.get("type") == "ConfigureFailure"
                and item.get("value") == self.PROBE_SPEED + n)

    def refusal_problem(self, status: int, body: bytes) -> str | None:
        """Deepgram refuses a bad query with HTTP 400 in its REST error shape, before the upgrade."""
        try:
            doc = json.loads(body)
            assert status == 400 and isinstance(doc.get("err_code"), str) and isinstance(doc.get("err_msg"), str)
        except (ValueError, AssertionError, AttributeError):
            return f"upgrade refused with HTTP {status}, not 400 in Deepgram's REST error shape: {body[:120]!r}"
        return None


class DashScope(Endpoint):
    """Qwen-TTS realtime: every event has a server event_id; an error is an `error` event and the socket lives on."""
    name, label, greeting = "dashscope /api-ws/v1/realtime", "dashscope", "session.created"
    json_audio = True

    def path(self, **query) -> str:
        return "/api-ws/v1/realtime" + _query({"model": "qwen-tts-realtime", **query})

    def is_error(self, item) -> bool:
        return isinstance(item, dict) and item.get("type") == "error"

    def problems(self, item) -> list[str]:
        if not isinstance(item, dict):
            return []
        out = [] if isinstance(item.get("event_id"), str) else [f"event without an event_id: {item}"]
        if self.is_error(item):
            error = item.get("error")
            if not isinstance(error, dict) or not all(isinstance(error.get(k), str) for k in ("type", "code", "message")):
                return out + [f"malformed error {item}"]
            if error["code"] == "internal_error":
                out.append("internal_error answered to a client's input")
            elif error["type"] == "server_error" and error["code"] not in SERVER_FAULT_CODES:
                out.append(f"server_error for a client's mistake ({error['code']})")
        return out

    def probe(self, n: int) -> str:
        return json.dumps({"type": f"probe.{n}"})

    def answers_probe(self, item, n: int) -> bool:
        return self.is_error(item) and f"'probe.{n}'" in json.dumps(item)

    def refusal_problem(self, status: int, body: bytes) -> str | None:
        """A connection without `model` is refused before the upgrade in DashScope's HTTP error shape."""
        try:
            doc = json.loads(body)
            assert status == 400 and isinstance(doc.get("code"), str) and isinstance(doc.get("message"), str)
        except (ValueError, AssertionError, AttributeError):
            return f"upgrade refused with HTTP {status}, not 400 in DashScope's error shape: {body[:120]!r}"
        return None


NATIVE, TWILIO, CARTESIA, DEEPGRAM = Native(), Twilio(), Cartesia(), Deepgram()
EL_MULTI, EL_SINGLE = ElevenLabs(multi=True), ElevenLabs(multi=False)
DEEPGRAM_V2, DASHSCOPE = DeepgramV2(), DashScope()
WS_ENDPOINTS = [NATIVE, TWILIO, EL_MULTI, EL_SINGLE, CARTESIA, DEEPGRAM, DEEPGRAM_V2, DASHSCOPE]


def _query(q: dict) -> str:
    from urllib.parse import urlencode
    return ("?" + urlencode(q)) if q else ""


# ----- one connection -----
class Conn:
    """A client connection that reads every frame and keeps what it read, parsed."""

    def __init__(self, ep: Endpoint, ws):
        self.ep, self.ws = ep, ws
        self.closed: tuple[int | None, str] | None = None
        self.abrupt = False
        self.n = 0

    @classmethod
    async def open(cls, ep: Endpoint, session: aiohttp.ClientSession, base_ws: str, path: str | None = None,
                   headers: dict | None = None, greet_timeout: float = 10.0) -> tuple["Conn", Reply]:
        ws = await session.ws_connect(base_ws + (path or ep.path()), headers=headers or {}, heartbeat=None,
                                      autoping=True, max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=5))
        conn = cls(ep, ws)
        reply = Reply()
        if ep.greeting is not None:
            reply = await conn.collect(lambda i: isinstance(i, dict) and i.get("type") == ep.greeting, greet_timeout)
        return conn, reply

    async def send(self, data: str | bytes) -> bool:
        if self.closed is not None:
            return False
        try:
            if isinstance(data, bytes):
                await self.ws.send_bytes(data)
            else:
                await self.ws.send_str(data)
            return True
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            return False

    async def collect(self, until, timeout: float) -> Reply:
        """Read until `until(item)` holds (answered), the connection ends, or `timeout` s pass."""
        reply = Reply()
        deadline = time.monotonic() + timeout
        while self.closed is None:
            left = deadline - time.monotonic()
            if left <= 0:
                reply.timed_out = True
                break
            try:
                msg = await self.ws.receive(timeout=left)
            except asyncio.TimeoutError:
                reply.timed_out = True
                break
            if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                item = msg.data
                if msg.type == aiohttp.WSMsgType.TEXT:
                    try:
                        item = strict_json(msg.data)
                    except ValueError:
                        pass
                reply.items.append(item)
                if until is not None and until(item):
                    reply.answered = True
                    break
            elif msg.type == aiohttp.WSMsgType.CLOSE:
                self.closed = (msg.data, msg.extra or "")
            else:        # CLOSED / ERROR: the TCP connection ended without a close frame from the server
                self.closed, self.abrupt = (self.ws.close_code, ""), True
        if self.closed is not None:
            reply.close, reply.abrupt = self.closed, self.abrupt
        return reply

    async def exchange(self, data: str | bytes, timeout: float = 20.0, window: float = 0.15) -> Reply:
        """Send one input and read its answer: up to the probe's answer, or for an endpoint without a
        probe, what comes within `window` s."""
        if not await self.send(data):
            return Reply(close=self.closed, abrupt=self.abrupt)
        self.n += 1
        n = self.n
        probe = self.ep.probe(n)
        if probe is None:
            reply = await self.collect(None, window)
            reply.timed_out = False
            return reply
        await self.send(probe)
        reply = await self.collect(lambda i: self.ep.answers_probe(i, n), timeout)
        if reply.answered:      # the probe's own answer (a Deepgram Warning, say) is not the input's
            reply.items.pop()
        return reply

    async def drain(self, timeout: float) -> Reply:
        reply = await self.collect(None, timeout)
        reply.timed_out = False
        return reply

    async def until_closed(self, quiet_s: float = 10.0, most_s: float = 240.0) -> Reply:
        """What comes until the server closes, timed out if it does not: a hang is quiet_s without a message, not a
        long utterance (a valid text of 3,000 characters is 60 s of audio, which a CPU engine under load makes
        slower than real time); most_s bounds the wait."""
        reply, deadline = Reply(), time.monotonic() + most_s
        while self.closed is None and time.monotonic() < deadline:
            part = await self.collect(None, quiet_s)
            reply.items += part.items
            if not part.items:
                break
        reply.timed_out = self.closed is None
        return reply

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.ws.close(), 5)
        except (asyncio.TimeoutError, ConnectionError, RuntimeError, aiohttp.ClientError):
            pass


# ----- the rules -----
def judge(ep: Endpoint, what: str, reply: Reply, phase, known_bad: bool, normal_end: bool = False,
          after_end: bool = False) -> bool:
    """Record on `phase` every rule the answer to one input breaks; True when it was answered with an error.
    `normal_end`: the input asked the server to close (a close then needs no error); `after_end`: an input
    before it did."""
    errors = [i for i in reply.items if ep.is_error(i)]
    where = f"{ep.name}: {what[:300]}"
    for item in reply.items:
        if isinstance(item, str):
            phase.fail("not strict JSON", f"{where} -> text frame {item[:120]!r}")
        for p in ep.problems(item):
            phase.fail("malformed answer", f"{where} -> {p}")
    if reply.timed_out:
        phase.fail("hang", f"{where} -> no answer to the probe: {reply.brief()}")
    close = reply.close
    error_close = bad_close = False
    if close is not None:
        code, reason = close
        bad_close = True
        if reply.abrupt:
            phase.fail("closed without a close frame", f"{where} -> {reply.brief()}")
        elif code == 1011:
            phase.fail("1011 for a client's input", f"{where} -> {reply.brief()}")
        elif code in (1000, 1001) and not errors and not (reason and normal_end):
            phase.fail("silent close", f"{where} -> close {code} {reason!r} and no error: {reply.brief()}")
        elif code not in (1000, 1001) and not reason and not errors:
            phase.fail("close without a reason", f"{where} -> {reply.brief()}")
        else:
            bad_close = False
        error_close = code not in (1000, 1001, 1011) and not reply.abrupt and bool(reason or errors)
    answered_error = bool(errors) or error_close
    # an input sent after the client asked to end may meet the end (a close with its reason) instead of an answer:
    # the server had finished the session before it read the input
    ended_first = after_end and close is not None and not bad_close
    if known_bad and not answered_error and not reply.timed_out and not bad_close and not ended_first:
        phase.fail("bad input not answered with an error", f"{where} -> {reply.brief() or 'nothing'}")
    if answered_error:
        phase.errors_answered += 1
    return answered_error


# ----- well-behaved sessions (warm-up, slot probe, mixed load) -----
async def native_session(session, base_ws: str, headers=None, fmt=None, transport="binary", frames=6,
                         text="Warm up, please.") -> None:
    conn, greet = await Conn.open(NATIVE, session, base_ws, headers=headers)
    assert greet.answered, f"no session.ready: {greet.brief()}"
    await conn.send(json.dumps({"type": "session.config", "audio_transport": transport,
                                "format": fmt or {"encoding": "pcm_s16le", "sample_rate": 24000}}))
    await conn.send(json.dumps({"type": "context.start", "context_id": "w", "fixed_frames": frames}))
    await conn.send(json.dumps({"type": "text", "context_id": "w", "text": text}))
    await conn.send(json.dumps({"type": "flush", "context_id": "w"}))
    r = await conn.collect(lambda i: isinstance(i, dict) and i.get("type") in ("context.done", "error"), 60)
    assert r.answered and r.jsons()[-1]["type"] == "context.done", r.brief()
    await conn.close()


async def elevenlabs_session(session, base_ws: str, multi: bool, headers=None, output_format="pcm_24000",
                             text="Warm up.") -> None:
    ep = EL_MULTI if multi else EL_SINGLE
    conn, _ = await Conn.open(ep, session, base_ws, path=ep.path(output_format=output_format), headers=headers)
    if multi:
        for m in ({"text": " ", "context_id": "w"}, {"text": text, "context_id": "w", "flush": True},
                  {"context_id": "w", "close_context": True}):
            await conn.send(json.dumps(m))
        r = await conn.collect(lambda i: isinstance(i, dict) and (i.get("isFinal") or "error" in i), 60)
    else:
        for m in ({"text": " "}, {"text": text, "flush": True}, {"text": ""}):
            await conn.send(json.dumps(m))
        r = await conn.collect(lambda i: isinstance(i, dict) and (i.get("isFinal") or "error" in i), 60)
    assert r.answered and not any("error" in i for i in r.jsons()), r.brief()
    await conn.close()


async def cartesia_session(session, base_ws: str, headers=None, encoding="pcm_s16le", rate=24000,
                           text="Warm up.") -> None:
    conn, _ = await Conn.open(CARTESIA, session, base_ws, headers=headers)
    await conn.send(json.dumps({"context_id": "w", "model_id": "sonic-2", "transcript": text, "continue": False,
                                "voice": CARTESIA_VOICE, "add_timestamps": True,
                                "output_format": {"container": "raw", "encoding": encoding, "sample_rate": rate}}))
    r = await conn.collect(lambda i: isinstance(i, dict) and i.get("type") in ("done", "error"), 60)
    assert r.answered and r.jsons()[-1]["type"] == "done", r.brief()
    await conn.close()


async def deepgram_session(session, base_ws: str, headers=None, text="Warm up.") -> None:
    conn, greet = await Conn.open(DEEPGRAM, session, base_ws, headers=headers)
    assert greet.answered, greet.brief()
    await conn.send(json.dumps({"type": "Speak", "text": text}))
    await conn.send(json.dumps({"type": "Flush"}))
    r = await conn.collect(lambda i: isinstance(i, dict) and i.get("type") == "Flushed", 60)
    assert r.answered and conn.closed is None, r.brief()
    await conn.send(json.dumps({"type": "Close"}))
    await conn.drain(10)
    await conn.close()


async def deepgram_v2_session(session, base_ws: str, headers=None, text="Warm up.") -> None:
    conn, greet = await Conn.open(DEEPGRAM_V2, session, base_ws, headers=headers)
    assert greet.answered, greet.brief()
    await conn.send(json.dumps({"type": "Speak", "text": text}))
    await conn.send(json.dumps({"type": "Flush"}))
    r = await conn.collect(lambda i: isinstance(i, dict) and i.get("type") in ("SpeechMetadata", "Error"), 60)
    assert r.answered and r.jsons()[-1]["type"] == "SpeechMetadata" and conn.closed is None, r.brief()
    await conn.send(json.dumps({"type": "Close"}))
    r = await conn.until_closed()
    assert conn.closed == (1000, "closed by client"), r.brief()


async def dashscope_session(session, base_ws: str, headers=None, response_format="pcm", rate=24000,
                            text="Warm up.") -> None:
    conn, greet = await Conn.open(DASHSCOPE, session, base_ws, headers=headers)
    assert greet.answered, greet.brief()
    for m in ({"type": "session.update", "session": {"voice": "Cherry", "response_format": response_format,
                                                      "sample_rate": rate}},
              {"type": "input_text_buffer.append", "text": text}, {"type": "session.finish"}):
        await conn.send(json.dumps(m))
    r = await conn.until_closed()
    kinds = [i.get("type") for i in r.jsons()]
    assert "error" not in kinds and kinds[-1:] == ["session.finished"] and conn.closed == (1000, "session finished"), \
        r.brief()


async def twilio_session(session, base_ws: str, headers=None, text="Warm up.") -> None:
    conn, greet = await Conn.open(TWILIO, session, base_ws, headers=headers)
    assert greet.answered, greet.brief()
    await conn.send(json.dumps({"type": "text", "context_id": "w", "text": text}))
    await conn.send(json.dumps({"type": "flush", "context_id": "w"}))
    r = await conn.collect(lambda i: isinstance(i, dict) and i.get("type") in ("context.done", "error"), 60)
    assert r.answered and r.jsons()[-1]["type"] == "context.done", r.brief()
    await conn.close()


async def http_speech(session, base: str, body: dict, headers=None) -> tuple[int, bytes]:
    async with session.post(base + "/v1/audio/speech", json=body, headers=headers or {}) as r:
        return r.status, await r.read()


async def warm_up(camp) -> None:
    url, ws, h = camp.server.url, camp.server.ws_url, camp.auth_headers

    async def http(s, fmt):
        status, body = await http_speech(s, url, {"input": "Warm up.", "response_format": fmt, "fixed_frames": 4}, h)
        assert status == 200, (fmt, status, body[:200])

    async with aiohttp.ClientSession() as s:
        jobs = [native_session(s, ws, h, {"encoding": enc, "sample_rate": rate}, transport) for enc, rate, transport in (
            ("pcm_s16le", 24000, "binary"), ("opus", 48000, "binary"), ("pcm_f32le", 16000, "base64"),
            ("mulaw", 8000, "binary"))]
        jobs += [elevenlabs_session(s, ws, True, h, out)
                 for out in ("pcm_24000", "mp3_44100_128", "opus_48000_64", "ulaw_8000")]
        jobs += [elevenlabs_session(s, ws, False, h), cartesia_session(s, ws, h),
                 cartesia_session(s, ws, h, "pcm_f32le", 44100), deepgram_session(s, ws, h), twilio_session(s, ws, h),
                 deepgram_v2_session(s, ws, h), dashscope_session(s, ws, h), dashscope_session(s, ws, h, "mp3", 24000),
                 dashscope_session(s, ws, h, "opus", 48000)]
        jobs += [http(s, fmt) for fmt in ("pcm", "wav", "mp3", "opus", "flac")]
        await asyncio.gather(*jobs)
    await asyncio.sleep(1.0)


async def slot_probe(camp, s, want: int) -> tuple[int, list]:
    """Open `want` contexts (no text) over as many native connections as the per-connection limit needs;
    -> (how many started, the refusals). Everything is cancelled and closed again."""
    conns, got, refusals = [], 0, []
    try:
        while got + len(refusals) < want:
            conn, greet = await Conn.open(NATIVE, s, camp.server.ws_url, headers=camp.auth_headers)
            conns.append(conn)
            if not greet.answered:
                refusals.append(greet.brief())
                break
            per_conn = greet.jsons()[-1]["limits"]["max_contexts_per_connection"]
            n = min(per_conn, want - got - len(refusals))
            for i in range(n):
                await conn.send(json.dumps({"type": "context.start", "context_id": f"slot{i}"}))
            seen = 0
            r = Reply()
            while seen < n:
                part = await conn.collect(
                    lambda i: isinstance(i, dict) and i.get("type") in ("context.started", "error"), 10)
                r.items += part.items
                if not part.answered:
                    refusals.append(f"no answer to a context.start: {part.brief()}")
                    break
                seen += 1
            got += sum(1 for i in r.jsons() if i.get("type") == "context.started")
            refusals += [i for i in r.jsons() if i.get("type") == "error"]
            if not part.answered:
                break
    finally:
        for conn in conns:
            await conn.send(json.dumps({"type": "cancel"}))
            await conn.close()
    return got, refusals
