"""Hand-picked adversarial inputs: every kind an earlier adversarial run (issue 21) found mishandled,
on every endpoint, each on a fresh connection and judged by the same rules as the mutations.

Each `Case` is known bad (it must be answered with the protocol's error), or must be served normally
("ok": control-token text is text to speak), or may go either way ("any": unknown fields).
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field

import aiohttp

from tests.fuzz.endpoints import (
    CARTESIA, CARTESIA_PCM, CARTESIA_VOICE, DASHSCOPE, DEEPGRAM, DEEPGRAM_V2, EL_MULTI, EL_SINGLE, NATIVE, TWILIO,
    WS_ENDPOINTS, Conn, Endpoint, cartesia_session, dashscope_session, deepgram_session, deepgram_v2_session,
    elevenlabs_session, judge, native_session, twilio_session,
)
from tests.fuzz.mutate import BIG, CONTROL_TOKENS
from tests.fuzz.rawws import Ended, HandshakeRefused, RawWebSocket

DEEP_1000 = "[" * 1000 + "]" * 1000
CONTROL_TEXT = "Say " + " then ".join(CONTROL_TOKENS) + " and keep talking."


@dataclass
class Case:
    ep: Endpoint
    what: str
    data: str | bytes
    expect: str = "error"           # error | any
    setup: list = field(default_factory=list)


def _raw(obj: dict, **raw_fields: str) -> str:
    """JSON of `obj` with fields whose values are raw JSON text (NaN, 1e400, a 1000-deep list)."""
    text = json.dumps(obj)
    extra = ", ".join(f"{json.dumps(k)}: {v}" for k, v in raw_fields.items())
    return text[:-1] + (", " if obj and extra else "") + extra + "}" if extra else text


def _templates(ep: Endpoint) -> tuple[dict, str, list]:
    """(a valid message carrying text, the name of its text field, setup messages it needs)."""
    if ep in (NATIVE, TWILIO):
        return {"type": "text", "context_id": "c1", "text": "hello "}, "text", []
    if ep is EL_MULTI:
        return {"text": "hello ", "context_id": "c1"}, "text", []
    if ep is EL_SINGLE:
        return {"text": "hello "}, "text", []
    if ep is CARTESIA:
        return ({"context_id": "c1", "transcript": "hello ", "voice": CARTESIA_VOICE, "output_format": CARTESIA_PCM,
                 "continue": True}, "transcript", [])
    if ep is DASHSCOPE:
        return {"type": "input_text_buffer.append", "text": "hello "}, "text", []
    return {"type": "Speak", "text": "hello "}, "text", []


def message_cases(ep: Endpoint, max_message_bytes: int) -> list[Case]:
    t, tf, _ = _templates(ep)
    c = []

    def bad(what, data):
        c.append(Case(ep, what, data))

    for text in ("{not json", '{"text": "a"', "", " ", "}{", '{"a": 1}}', "nul\u0000l"):
        bad(f"invalid JSON {text!r}", text)
    for lit in ("NaN", "Infinity", "-Infinity"):
        bad(f"{lit} in an extra field", _raw(t, n=lit))
        bad(f"{lit} as {tf}", _raw({k: v for k, v in t.items() if k != tf}, **{tf: lit}))
    bad("1e400 (a float that overflows to inf) in an extra field", _raw(t, n="1e400"))
    bad("a message that is a list nested 1000 deep", DEEP_1000)
    bad("a field nested 1000 deep", _raw(t, deep=DEEP_1000))
    bad(f"{tf} nested 1000 deep", _raw({k: v for k, v in t.items() if k != tf}, **{tf: DEEP_1000}))
    bad("an object nested 3000 deep", '{"a":' * 3000 + "1" + "}" * 3000)
    for s in ("\ud800 hello", "hello \udfff", "\udc00\ud800"):
        bad(f"lone surrogate in {tf}: {s!r}", json.dumps({**t, tf: s}))
    if "context_id" in t:
        bad("lone surrogate in context_id", json.dumps({**t, "context_id": "c\ud800"}))
    bad(f"a 401-digit number as {tf}", json.dumps({**t, tf: BIG}))
    bad(f"a -401-digit number as {tf}", json.dumps({**t, tf: -BIG}))
    for v in (["a"], {"a": 1}, True, 5, 1.5):
        bad(f"{tf} = {json.dumps(v)}", json.dumps({**t, tf: v}))
    if "context_id" in t:
        for v in (["c1"], 7, {"id": 1}):
            bad(f"context_id = {json.dumps(v)}", json.dumps({**t, "context_id": v}))
    if "type" in t:
        for v in (["text"], 5, None, "dance", "TEXT"):
            bad(f"type = {json.dumps(v)}", json.dumps({**t, "type": v}))
    bad("a list, not an object", json.dumps([t]))
    for v in ("5", '"text"', "null", "true"):
        bad(f"a JSON scalar {v}", v)
    bad(f"{max_message_bytes + 1} bytes (one over the limit)", json.dumps({**t, tf: "x" * max_message_bytes}))
    bad(f"{3 * max_message_bytes} bytes", json.dumps({**t, tf: "y " * (3 * max_message_bytes // 2)}))
    bad("a binary frame", b"\x00\x01\x02")
    bad("the valid message as a binary frame", json.dumps(t).encode())
    c.append(Case(ep, "unknown fields, ASCII and not", json.dumps({**t, "unknown_field": 1, "ключ": "значение",
                                                                   "キー": [1, {"a": None}]}), expect="any"))
    # protocol-specific fields
    if ep in (NATIVE, TWILIO):
        start = {"type": "context.start", "context_id": "s1"}
        for v, name in ((BIG, "fixed_frames"), (0, "fixed_frames"), (1.5, "fixed_frames"), (True, "fixed_frames"),
                        (BIG, "speed"), (-1, "speed"), ("1.0", "speed"), (["ryan"], "voice"), ("\ud800", "voice"),
                        (5, "language")):
            bad(f"context.start {name} = {_short(v)}", json.dumps({**start, name: v}))
        for seed in (BIG, 2 ** 64, -(2 ** 63) - 1, "1", 1.5):
            bad(f"context.start sampling.seed = {_short(seed)}", json.dumps({**start, "sampling": {"seed": seed}}))
        bad("context.start sampling.temperature = NaN", _raw(start, sampling='{"temperature": NaN}'))
        bad("context.start sampling with an unknown key", json.dumps({**start, "sampling": {"seed": 1, "foo": 1}}))
        bad("context_id of 65 characters", json.dumps({**t, "context_id": "c" * 65}))
        bad("context_id with a space", json.dumps({**t, "context_id": "a b"}))
    if ep is NATIVE:
        for v in (BIG, 44100.0, "24000", 11025, 0):
            bad(f"format.sample_rate = {_short(v)}", json.dumps({"type": "session.config",
                                                                 "format": {"encoding": "pcm_s16le", "sample_rate": v}}))
        for seed in (2 ** 64, -(2 ** 63) - 1, BIG):
            bad(f"session.config sampling.seed = {_short(seed)} (out of range before any context starts)",
                json.dumps({"type": "session.config", "sampling": {"seed": seed}}))
        bad("session.config format with an unknown key", json.dumps(
            {"type": "session.config", "format": {"encoding": "pcm_s16le", "sample_rate": 24000, "bits": 16}}))
        bad("session.config audio_transport = 'json'", json.dumps({"type": "session.config", "audio_transport": "json"}))
        for enc in ("mp3", "flac", "ogg_opus", "wav"):
            bad(f"context.start format {enc} (not carried by the native protocol)", json.dumps(
                {"type": "context.start", "context_id": "e1", "fixed_frames": 2,
                 "format": {"encoding": enc, "sample_rate": 24000}}))
            bad(f"session.config format {enc}", json.dumps({"type": "session.config",
                                                            "format": {"encoding": enc, "sample_rate": 24000}}))
            c.append(Case(ep, f"context.start format {enc} with base64 transport", json.dumps(
                {"type": "context.start", "context_id": "e2", "fixed_frames": 2,
                 "format": {"encoding": enc, "sample_rate": 24000}}),
                setup=[json.dumps({"type": "session.config", "audio_transport": "base64"})]))
        bad("auth after the session is authenticated", json.dumps({"type": "auth", "api_key": "x"}))
    if ep is TWILIO:
        bad("format in the Twilio mode", json.dumps({"type": "session.config", "format": {"encoding": "pcm_s16le",
                                                                                           "sample_rate": 24000}}))
    if ep is EL_MULTI:
        for k, v in (("flush", "yes"), ("flush", BIG), ("close_context", "true"), ("voice_settings", ["x"]),
                     ("generation_config", "fast")):
            bad(f"{k} = {_short(v)}", json.dumps({**t, k: v}))
        bad("text without context_id", json.dumps({"text": "hello"}))
    if ep is EL_SINGLE:
        for k, v in (("flush", "yes"), ("voice_settings", 5)):
            bad(f"{k} = {_short(v)}", json.dumps({**t, k: v}))
        bad("neither text nor flush", json.dumps({"voice_settings": {}}))
    if ep is CARTESIA:
        base = {k: v for k, v in t.items() if k != "voice"}
        # a voice id as a plain string is valid (the Cartesia SDK 4 sends it so); an empty one is not
        for v in ({}, {"mode": "id"}, {"mode": "id", "id": 5}, {"mode": "embedding", "embedding": [0.1]}, "",
                  {"mode": "id", "id": "\ud800"}):
            bad(f"voice = {_short(v)}", json.dumps({**base, "context_id": "v1", "voice": v}))
        for fmt in ({"container": "raw", "encoding": "pcm_s16le", "sample_rate": BIG},
                    {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000.0},
                    {"container": "mp3", "encoding": "pcm_s16le", "sample_rate": 24000}, "pcm", None):
            bad(f"output_format = {_short(fmt)}", json.dumps({**t, "context_id": "o1", "output_format": fmt}))
        for k, v in (("continue", "no"), ("flush", 1), ("cancel", "true"), ("add_timestamps", BIG)):
            bad(f"{k} = {_short(v)}", json.dumps({**t, k: v}))
        bad("empty context_id", json.dumps({**t, "context_id": ""}))
        bad("no context_id", json.dumps({k: v for k, v in t.items() if k != "context_id"}))
    if ep in (DEEPGRAM, DEEPGRAM_V2):
        bad("Speak of 2001 characters", json.dumps({"type": "Speak", "text": "z" * 2001}))
        bad("Speak without text", json.dumps({"type": "Speak"}))
    if ep is DEEPGRAM_V2:
        bad("Clear (/v1/speak's; Flux has Interrupt)", json.dumps({"type": "Clear"}))
        for speed in (1.55, 0.45, 2, 0, -1, 1.07, BIG, "1.0", True, [1]):
            bad(f"Configure speed = {_short(speed)}", json.dumps({"type": "Configure", "speed": speed}))
        for offset in ({"type": "time_ms", "value": -1}, {"type": "time_ms", "value": 1.5}, {"type": "bytes", "value": 5},
                       {"type": "time_ms"}, {"type": "time_ms", "value": BIG}, 5, "5", [5]):
            # the checks of playback_offset come before "nothing to interrupt": no audio is needed for them
            bad(f"Interrupt playback_offset = {_short(offset)}", json.dumps({"type": "Interrupt", "playback_offset": offset}))
    if ep is DASHSCOPE:
        def update(**session):
            return json.dumps({"type": "session.update", "session": session})
        for k, v in (("voice", 5), ("voice", "\ud800"), ("mode", "auto"), ("mode", 1), ("response_format", "ogg"),
                     ("response_format", ["pcm"]), ("sample_rate", 11025), ("sample_rate", "24000"),
                     ("sample_rate", 24000.0), ("sample_rate", BIG), ("speech_rate", 2.5), ("speech_rate", True),
                     ("volume", 101), ("volume", 50.5), ("pitch_rate", 0.1), ("bit_rate", 5), ("bit_rate", BIG),
                     ("language_type", 5), ("instructions", ["x"])):
            bad(f"session.update {k} = {_short(v)}", update(**{k: v}))
        bad("session.update opus at 22050 Hz (the codec cannot)", update(response_format="opus", sample_rate=22050))
        for v in ([], "voice=Cherry", 5):
            bad(f"session.update session = {_short(v)}", json.dumps({"type": "session.update", "session": v}))
        bad("input_text_buffer.append without text", json.dumps({"type": "input_text_buffer.append"}))
        bad("input_text_buffer.commit with nothing to commit", json.dumps({"type": "input_text_buffer.commit"}))
        bad("response.cancel with nothing in progress", json.dumps({"type": "response.cancel"}))
        c.append(Case(ep, "session.update after text (DashScope: the session has started)",
                      update(voice="Ethan"), setup=[json.dumps(t)]))
        # three messages of half the message limit each: past --max-text-chars' default 20,000 with 16 KiB messages
        third = json.dumps({**t, "text": "w " * (max_message_bytes // 4)})
        c.append(Case(ep, "uncommitted text past the session's text limit, mode commit", third,
                      setup=[update(mode="commit"), third, third]))
    return c


def first_message_cases(ep: Endpoint) -> list[Case]:
    """A non-ASCII key in the connection's first message (the key the protocol needs, spelled wrong)."""
    t, tf, _ = _templates(ep)
    renamed = {("tëxt" if k == tf else k): v for k, v in t.items()}
    # Cartesia's transcript is optional: without it the message only opens the context
    out = [Case(ep, f"first message with '{tf}' spelled 'tëxt'", json.dumps(renamed),
                expect="any" if ep is CARTESIA else "error")]
    if "type" in t:
        out.append(Case(ep, "first message with 'type' spelled 'typé'",
                        json.dumps({("typé" if k == "type" else k): v for k, v in t.items()})))
    if "context_id" in t and ep is not NATIVE and ep is not TWILIO:
        out.append(Case(ep, "first message with 'context_id' spelled 'cöntext_id'",
                        json.dumps({("cöntext_id" if k == "context_id" else k): v for k, v in t.items()})))
    return out


async def run_case(camp, phase, case: Case, session) -> None:
    ep = case.ep
    conn, greet = await Conn.open(ep, session, camp.server.ws_url, headers=camp.auth_headers)
    try:
        if ep.greeting is not None and not greet.answered:
            phase.fail("no greeting", f"{ep.name}: {greet.brief()}")
            return
        for m in case.setup:
            judge(ep, "setup " + m[:80], await conn.exchange(m), phase, False)
        if ep is EL_SINGLE:
            reply = await conn.exchange(case.data, window=0.05)
            if conn.closed is None:
                await conn.send(json.dumps({"text": ""}))
                rest = await conn.until_closed()
                reply.items += rest.items
                reply.timed_out = rest.timed_out
            reply.close, reply.abrupt = conn.closed, conn.abrupt
            judge(ep, case.what, reply, phase, case.expect == "error", normal_end=True)
        else:
            judge(ep, case.what, await conn.exchange(case.data), phase, case.expect == "error")
    finally:
        await conn.close()


async def run_cases(camp, phase, cases: list[Case], parallel: int = 4) -> None:
    sem = asyncio.Semaphore(parallel)
    async with aiohttp.ClientSession() as s:
        async def one(case):
            async with sem:
                try:
                    await asyncio.wait_for(run_case(camp, phase, case, s), 60)
                except asyncio.TimeoutError:
                    phase.fail("hang", f"{case.ep.name}: {case.what}: no end within 60 s")
        await asyncio.gather(*(one(c) for c in cases))


# ----- inputs that must be served as usual -----
async def control_token_text(camp, phase) -> None:
    """Text that contains the model's control tokens is text: every protocol speaks it to the end (short
    texts, two tokens each, so that the frame budget the text buys stays small)."""
    ws, h = camp.server.ws_url, camp.auth_headers
    pairs = [CONTROL_TOKENS[i:i + 2] for i in range(0, len(CONTROL_TOKENS), 2)]
    texts = [f"A{a}b{b[0] if b else ''}c." for a, *b in pairs]

    async def one(s, name, make, text):
        try:
            await asyncio.wait_for(make(text), 90)
        except (AssertionError, asyncio.TimeoutError) as e:
            phase.fail("control-token text not spoken", f"{name}: {text!r} -> {str(e)[:300] or type(e).__name__}")

    async with aiohttp.ClientSession() as s:
        makers = [("native", lambda t: native_session(s, ws, h, text=t, frames=8)),
                  ("twilio", lambda t: twilio_session(s, ws, h, text=t)),
                  ("elevenlabs multi", lambda t: elevenlabs_session(s, ws, True, h, text=t)),
                  ("elevenlabs single", lambda t: elevenlabs_session(s, ws, False, h, text=t)),
                  ("cartesia", lambda t: cartesia_session(s, ws, h, text=t)),
                  ("deepgram", lambda t: deepgram_session(s, ws, h, text=t)),
                  ("deepgram v2", lambda t: deepgram_v2_session(s, ws, h, text=t)),
                  ("dashscope", lambda t: dashscope_session(s, ws, h, text=t))]
        jobs = [one(s, "native", makers[0][1], CONTROL_TEXT)]
        jobs += [one(s, name, make, texts[i % len(texts)]) for i, (name, make) in enumerate(makers[1:])]
        await asyncio.gather(*jobs)


async def contexts_after_close(camp, phase) -> None:
    """`close` finishes the contexts in flight; a context started after it is refused."""
    await asyncio.gather(*(_after_close(camp, phase, ep) for ep in (NATIVE, TWILIO)))


async def _after_close(camp, phase, ep) -> None:
    async with aiohttp.ClientSession() as s:
        conn, _ = await Conn.open(ep, s, camp.server.ws_url, headers=camp.auth_headers)
        for m in ({"type": "context.start", "context_id": "a", "fixed_frames": 20},
                  {"type": "text", "context_id": "a", "text": "Finishing."}, {"type": "flush", "context_id": "a"},
                  {"type": "close"}):
            await conn.send(json.dumps(m))
        reply = await conn.exchange(json.dumps({"type": "context.start", "context_id": "b"}))
        late = await conn.exchange(json.dumps({"type": "text", "context_id": "c", "text": "More."}))
        rest = await conn.drain(15)
        started = [m.get("context_id") for m in reply.jsons() + late.jsons() + rest.jsons()
                   if m.get("type") == "context.started"]
        if "b" in started or "c" in started:
            phase.fail("context after close", f"{ep.name}: a context started after `close` was accepted: {started}")
        judge(ep, "context.start after close", reply, phase, known_bad=True)
        done = [m for m in reply.jsons() + late.jsons() + rest.jsons() if m.get("type") == "context.done"]
        if not done or conn.closed is None or conn.closed[0] != 1000:
            phase.fail("close", f"{ep.name}: after `close` the context in flight should finish and the socket "
                       f"close with 1000: {rest.brief()}")
        await conn.close()


# ----- the upgrade: query parameters and keys checked after the 101 -----
def refused_properly(port: int, path: str, headers: dict | None = None, raw_headers: bytes = b"",
                     first: str | None = None, served_marks: tuple = (), refused_by: Endpoint = NATIVE) -> str | None:
    """Open `path`; it must be refused with the protocol's error: before the upgrade an HTTP answer as
    `refused_by` refuses a connection (talkgate's 4xx JSON error unless the endpoint's API has its own), or
    after it an error and/or a close frame (not 1000, not 1011) with a reason. -> what was wrong, or None."""
    try:
        ws = RawWebSocket.connect(port, path, headers, raw_headers=raw_headers)
    except HandshakeRefused as e:
        return refused_by.refusal_problem(e.status, e.body)
    except (ConnectionError, OSError) as e:
        return f"connection failed: {e!r}"
    try:
        if first is not None:
            ws.send_text(first)
        texts, end = [], None
        deadline = time.monotonic() + 10
        while end is None:
            f = ws.recv_frame(max(0.01, deadline - time.monotonic()))
            if isinstance(f, Ended) or f.opcode == 8:
                end = f
            elif f.opcode == 1:
                texts.append(f.payload.decode("utf-8", "replace"))
                if any(mark in texts[-1] for mark in served_marks):
                    return f"served: {texts[:2]}"
        if isinstance(end, Ended):
            return (f"no close frame ({end.how}); bytes: {end.garbage[:100]!r}; frames before: {texts[:2]}")
        has_error = any('"error' in t or "Warning" in t for t in texts)
        if end.close_code in (1000, 1001, 1011) and not has_error:
            return f"closed {end.close_code} {end.close_reason!r} with no error: {texts[:2]}"
        if not end.close_reason and not has_error:
            return f"closed {end.close_code} without a reason"
        if end.close_code == 1011:
            return f"closed 1011 ({end.close_reason!r}) for a client's mistake"
        return None
    finally:
        ws.close()


QUERY_CASES = [
    # (endpoint, query, what)
    (EL_MULTI, {"inactivity_timeout": "²"}, "inactivity_timeout=² (a superscript digit)"),
    (EL_MULTI, {"inactivity_timeout": "١٢"}, "inactivity_timeout in Arabic-Indic digits"),
    (EL_MULTI, {"inactivity_timeout": "１０"}, "inactivity_timeout in fullwidth digits"),
    (EL_SINGLE, {"inactivity_timeout": "²"}, "inactivity_timeout=²"),
    (EL_MULTI, {"seed": "²"}, "seed=²"),
    (EL_MULTI, {"seed": "１２３"}, "seed in fullwidth digits"),
    (EL_MULTI, {"seed": str(BIG)}, "seed of 401 digits"),
    (EL_MULTI, {"seed": str(2 ** 64)}, "seed = 2^64 (out of range)"),
    (EL_MULTI, {"inactivity_timeout": str(BIG)}, "inactivity_timeout of 401 digits"),
    (EL_MULTI, {"output_format": "pcm_²⁴⁰⁰⁰"}, "output_format with superscript digits"),
    (EL_MULTI, {"enable_ssml_parsing": "yes"}, "enable_ssml_parsing=yes (true or false)"),
    (EL_SINGLE, {"enable_ssml_parsing": "1"}, "enable_ssml_parsing=1"),
    (EL_MULTI, {"sync_alignment": "\u0000"}, "sync_alignment with a NUL"),
    (EL_MULTI, {"apply_text_normalization": "always"}, "apply_text_normalization=always"),
    (DEEPGRAM, {"sample_rate": "²"}, "sample_rate=²"),
    (DEEPGRAM, {"sample_rate": "１６０００"}, "sample_rate in fullwidth digits"),
    (DEEPGRAM, {"sample_rate": str(BIG)}, "sample_rate of 401 digits"),
    (DEEPGRAM, {"encoding": "linear16\u0000"}, "encoding with a NUL"),
    (DEEPGRAM, {"speed": "1.6"}, "speed above 1.5 (Aura-2's range: 0.7 to 1.5)"),
    (DEEPGRAM, {"speed": "0.5"}, "speed below 0.7"),
    (DEEPGRAM, {"speed": "NaN"}, "speed=NaN"),
    (DEEPGRAM, {"speed": "²"}, "speed=²"),
    (DEEPGRAM, {"speed": str(BIG)}, "speed of 401 digits"),
    # /v2/speak checks its query before the upgrade (HTTP 400, Deepgram's REST shape)
    (DEEPGRAM_V2, {"sample_rate": "²"}, "sample_rate=²"),
    (DEEPGRAM_V2, {"sample_rate": "１６０００"}, "sample_rate in fullwidth digits"),
    (DEEPGRAM_V2, {"sample_rate": str(BIG)}, "sample_rate of 401 digits"),
    (DEEPGRAM_V2, {"sample_rate": "16000", "encoding": "mulaw"}, "mulaw at 16000 Hz (talkgate's G.711 is 8 kHz)"),
    (DEEPGRAM_V2, {"encoding": "linear16\u0000"}, "encoding with a NUL"),
    (DEEPGRAM_V2, {"model": ""}, "an empty model"),
    (DEEPGRAM_V2, {"model": "flux-nobody-en"}, "an unknown model"),
    (DEEPGRAM_V2, {"speed": "²"}, "speed=²"),
    (DEEPGRAM_V2, {"speed": "1.55"}, "speed out of range"),
    (DEEPGRAM_V2, {"speed": "1.07"}, "speed not a multiple of 0.05"),
    (DEEPGRAM_V2, {"speed": "NaN"}, "speed=NaN"),
    (DEEPGRAM_V2, {"speed": "1e0"}, "speed in exponent notation"),
    (DEEPGRAM_V2, {"speed": str(BIG)}, "speed of 401 digits"),
    (DEEPGRAM_V2, {"expressivity": "١"}, "expressivity in Arabic-Indic digits"),
    (DEEPGRAM_V2, {"expressivity": "1.5"}, "expressivity not an integer"),
    (DEEPGRAM_V2, {"expressivity": "3"}, "expressivity out of range"),
    (DASHSCOPE, {"model": ""}, "an empty model"),
]
SERVED = ('"isFinal"', '"Metadata"', '"session.ready"', '"Connected"', '"session.created"')


async def query_cases(camp, phase) -> None:
    for ep, query, what in QUERY_CASES:
        problem = await asyncio.to_thread(refused_properly, camp.server.port, ep.path(**query), camp.auth_headers,
                                          first=json.dumps({"context_id": "q", "close_context": True}) if ep is EL_MULTI
                                          else json.dumps({"text": ""}) if ep is EL_SINGLE else None,
                                          served_marks=SERVED, refused_by=ep)
        if problem:
            phase.fail("bad query parameter", f"{ep.name}: {what}: {problem}")
        else:
            phase.errors_answered += 1


def _short(v) -> str:
    s = json.dumps(v) if not isinstance(v, int) or abs(v) < 10 ** 20 else f"<{len(str(abs(v)))}-digit int>"
    return s[:60]


def all_message_cases(max_message_bytes: int) -> list[Case]:
    out = []
    for ep in WS_ENDPOINTS:
        out += message_cases(ep, max_message_bytes) + first_message_cases(ep)
    return out



# ----- docs, schema and server agree -----
ENCODING_FAMILIES = {"opus": "Opus", "pcm_s16le": "PCM", "pcm_f32le": "PCM", "mulaw": "mu-law", "alaw": "A-law"}
CANDIDATE_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 96000)


def documented_rates() -> dict[str, set[int]]:
    """docs/protocol.md's format paragraph ("Opus: 24000 or 48000 Hz ...; PCM: ...; mu-law and A-law:
    8000 Hz") -> the sample rates of each encoding."""
    from tests.fuzz.endpoints import DOCS
    text = (DOCS / "protocol.md").read_text()
    para = text.split("`format`:", 1)[1].split("\n\n", 1)[0]
    pieces = re.split(r";|\.\s", para)
    out = {}
    for enc, family in ENCODING_FAMILIES.items():
        found = [m.group(1) for p in pieces if (m := re.search(rf"\b{re.escape(family)}\b[^:]*:(.*)", p, re.S))]
        out[enc] = {int(n) for n in re.findall(r"\b(\d{4,5})\b", found[0])} if found else set()
    return out


def documented_reasons() -> set[str]:
    from tests.fuzz.endpoints import DOCS
    text = (DOCS / "protocol.md").read_text()
    row = next((line for line in text.splitlines() if line.startswith("| `context.done`")), "")
    m = re.search(r"`reason` \(([^)]*)\)", row)
    return set(re.findall(r"`([a-z_]+)`", m.group(1))) if m else set()


async def formats_agree(camp, phase) -> None:
    from tests.fuzz.endpoints import SCHEMA
    docs = documented_rates()
    if not all(docs.values()):
        phase.fail("docs", f"docs/protocol.md's `format` paragraph does not give the rates of every encoding: {docs}")
    fmt = SCHEMA["$defs"]["format"]["properties"]
    schema_rates, schema_encodings = set(fmt["sample_rate"]["enum"]), set(fmt["encoding"]["enum"])
    if schema_encodings != set(ENCODING_FAMILIES):
        phase.fail("schema", f"schema encodings {sorted(schema_encodings)} are not the documented {sorted(ENCODING_FAMILIES)}")
    union = set().union(*docs.values())
    if schema_rates != union:
        phase.fail("docs and schema disagree", f"schema sample rates {sorted(schema_rates)}, docs {sorted(union)}")
    accepted: dict[str, set[int]] = {}
    async with aiohttp.ClientSession() as s:
        conn, _ = await Conn.open(NATIVE, s, camp.server.ws_url, headers=camp.auth_headers)
        for enc in ENCODING_FAMILIES:
            accepted[enc] = set()
            for rate in CANDIDATE_RATES:
                reply = await conn.exchange(json.dumps({"type": "session.config",
                                                        "format": {"encoding": enc, "sample_rate": rate}}))
                judge(NATIVE, f"format {enc} {rate}", reply, phase, False)
                kinds = {m.get("type") for m in reply.jsons()}
                if "session.configured" in kinds:
                    accepted[enc].add(rate)
        for enc in ENCODING_FAMILIES:
            if accepted[enc] != docs[enc]:
                phase.fail("docs and server disagree", f"{enc}: the server takes {sorted(accepted[enc])} Hz, "
                           f"docs/protocol.md says {sorted(docs[enc])}")
        await conn.send(json.dumps({"type": "context.start", "context_id": "e"}))
        reply = await conn.exchange(json.dumps({"type": "flush", "context_id": "e"}))
        await conn.close()
    reasons = set(SCHEMA["$defs"]["server"]["oneOf"][5]["properties"]["reason"]["enum"])
    docs_reasons = documented_reasons()
    if reasons != docs_reasons:
        phase.fail("docs and schema disagree", f"context.done reasons: schema {sorted(reasons)}, docs {sorted(docs_reasons)}")
    for m in reply.jsons():
        if m.get("type") == "context.done" and m.get("reason") not in docs_reasons:
            phase.fail("docs and server disagree", f"an empty context ends with reason {m.get('reason')!r}, "
                       f"docs list {sorted(docs_reasons)}")


# ----- requests aiohttp's HTTP parser refuses before the application -----
MALFORMED_HTTP = [
    ("a request line that is not HTTP", b"HELLO\r\n\r\n"),
    ("a header line of 9000 bytes", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n"),
    ("a header name with a space", b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n"),
    ("a negative Content-Length", b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"),
    ("two Content-Lengths",
     b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
    ("a bad chunk size",
     b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
    ("HTTP/9.9", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n"),
    ("a NUL in the path", b"GET /he\x00alth HTTP/1.1\r\nHost: x\r\n\r\n"),
]


async def malformed_http(camp, phase) -> None:
    """aiohttp answers these itself (text/plain, before any middleware): they must be 4xx, never 5xx,
    and cost the server nothing (the phase's checks)."""
    from tests.fuzz.access import _raw_http
    for what, raw in MALFORMED_HTTP:
        try:
            status, data = await asyncio.to_thread(_raw_http, camp.server.port, raw)
        except OSError as e:
            status, data = -1, repr(e).encode()
        if not 400 <= status < 500 and status != -1:
            phase.fail("malformed HTTP", f"{what}: {data[:120]!r}")
