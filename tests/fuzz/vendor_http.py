"""The vendor-compatible HTTP speech endpoints' request bodies (docs/compat.md): ElevenLabs text-to-speech (its four
routes), Cartesia `/tts/bytes` and `/tts/sse`, Deepgram `POST /v1/speak` and DashScope's Qwen TTS (streamed and
not). Each gets a valid request (served: 200 with audio), then hostile bodies; every answer is judged by
workers.judge_http with the endpoint's OWN error shape (one predicate per vendor below: what its translator's
http_error makes and docs/compat.md documents), one set of keys per vendor."""
from __future__ import annotations

import asyncio
import base64
import gzip
import json
from dataclasses import dataclass, field

import aiohttp

from tests.fuzz.endpoints import strict_json
from tests.fuzz.mutate import BIG, CONTROL_TOKENS, set_path
from tests.fuzz.workers import HttpRequest, judge_http, judge_shapes, openai_error, send_http

SERVED, REFUSED, EITHER = "served", "refused", "either"
# refused by aiohttp's parser from the headers alone, before the request has a path (Content-Encoding br without
# the Brotli package): answered in talkgate's own shape (server/errors.py JsonErrorHandler), as every such request
BEFORE_ROUTING = "refused before routing"
DASHSCOPE_PATH = "/api/v1/services/aigc/multimodal-generation/generation"
NO_STORED_VOICE = "voice_0123456789abcdef"      # a stored voice's id, never stored: refused by the session


def _keys(doc, want: set[str], strings: tuple[str, ...]) -> bool:
    return isinstance(doc, dict) and set(doc) == want and all(isinstance(doc[k], str) and doc[k] for k in strings)


def elevenlabs_error(doc, status: int) -> str | None:
    """{"detail": {"status", "message"}} -> its status (the code)."""
    if isinstance(doc, dict) and set(doc) == {"detail"} and _keys(doc["detail"], {"status", "message"},
                                                                   ("status", "message")):
        return doc["detail"]["status"]
    return None


def cartesia_error(doc, status: int) -> str | None:
    """Cartesia's error event as the body: type error, done, its HTTP status as status_code."""
    want = {"type", "done", "title", "message", "error_code", "status_code", "request_id", "context_id"}
    if (_keys(doc, want, ("title", "message", "error_code")) and doc["type"] == "error" and doc["done"] is True
            and doc["status_code"] == status):
        return doc["error_code"]
    return None


def cartesia_voice_error(doc, status: int) -> str | None:
    """Cartesia's voice API error: {"title", "message", "error_code", "status_code"}, its HTTP status as status_code."""
    if _keys(doc, {"title", "message", "error_code", "status_code"}, ("title", "message", "error_code")) \
            and doc["status_code"] == status:
        return doc["error_code"]
    return None


def deepgram_error(doc, status: int) -> str | None:
    """{"err_code", "err_msg", "request_id"}, every one a string."""
    want = ("err_code", "err_msg", "request_id")
    return doc["err_code"] if _keys(doc, set(want), want) else None


def dashscope_error(doc, status: int) -> str | None:
    """{"code", "message", "request_id"}, every one a string."""
    want = ("code", "message", "request_id")
    return doc["code"] if _keys(doc, set(want), want) else None


@dataclass
class Endpoint:
    """One vendor HTTP route: its path (query included), a valid body, where its text goes, its error shape,
    the wrong values of its documented fields and its extra headers."""
    name: str
    path: str
    valid: dict
    text: tuple[str, ...]              # the text field's path in the body
    shape: object                      # (doc, status) -> the error's code, or None when it is not the vendor's shape
    max_chars: int | None = None       # its own text limit, else the server's --max-text-chars
    numbers: list = field(default_factory=list)     # its numeric fields' paths
    wrong: list = field(default_factory=list)       # (field path, bad value)
    maybe: list = field(default_factory=list)       # (field path, value) the server may take or refuse
    queries: list = field(default_factory=list)     # (what, a bad path or query replacing the endpoint's)
    headers: dict = field(default_factory=dict)
    first: bool = True                 # the vendor's first route: the cases that make audio run here only

    @property
    def vendor(self) -> str:
        return self.name.split()[0]


NOT_JSON_NUMBERS = (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", str(BIG).encode())
TYPES = [[], ["x"], {}, {"k": "v"}, 5, 1.5, True, "x"]       # wrong types for each field: those of its own type skipped
NUMBERS = [-1, 0, 1e308, 5e-324, BIG, -BIG, 2 ** 64, 10 ** 9]
EL_QUERY = "?output_format=pcm_24000"
EL_VALID = {"text": "Hello there.", "model_id": "eleven_flash_v2_5"}
EL_NUMBERS = [("seed",), ("voice_settings", "speed"), ("voice_settings", "stability")]
EL_WRONG = [(("seed",), v) for v in (-1, 2 ** 32, BIG, 1.5, "7", [])]
EL_WRONG += [(("voice_settings",), v) for v in ("x", [], 5)]
EL_WRONG += [(("voice_settings", k), v) for k in ("speed", "stability", "similarity_boost", "style")
             for v in ("fast", [], 100, -1, BIG, 1e308)]
EL_WRONG += [(("voice_settings", "use_speaker_boost"), v) for v in ("yes", 1)]
EL_WRONG += [((k,), v) for k in ("model_id", "language_code", "previous_text", "next_text", "apply_text_normalization")
             for v in (5, [], {})]
EL_WRONG += [(("apply_text_normalization",), "sometimes"), (("model_id",), "no-such-model")]
EL_WRONG += [((k,), v) for k in ("pronunciation_dictionary_locators", "previous_request_ids", "next_request_ids")
             for v in ("x", 5, {})]
EL_WRONG += [(("audio_effects",), v) for v in ("x", 5, [])]
EL_FORMATS = ("pcm_1", "pcm_0", "pcm_99999999999999999999", "pcm_%C2%B2%C2%B4", "mp3_44100_1", "wav_24000x", "",
              "x" * 300)
EL_QUERIES = [(f"output_format={v}", f"?output_format={v}") for v in EL_FORMATS]
EL_VOICES = (NO_STORED_VOICE, "%00", "x" * 2000, "..%2Fvoices", "%C2%B2")
EL_QUERIES += [(f"optimize_streaming_latency={v}", f"{EL_QUERY}&optimize_streaming_latency={v}")
               for v in ("5", "-1", "1e400", "NaN", "%EF%BC%91")]

CARTESIA_VALID = {"model_id": "sonic-2", "transcript": "Hello there.", "voice": {"mode": "id", "id": "ryan"},
                  "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}}
CARTESIA_NUMBERS = [("output_format", "sample_rate"), ("generation_config", "speed"), ("generation_config", "volume"),
                    ("max_buffer_delay_ms",)]
CARTESIA_WRONG = [(("voice",), v) for v in (5, [], {}, {"mode": "embedding", "embedding": [0.1] * 8}, {"mode": "id"},
                                            {"mode": "id", "id": 5}, {"mode": "id", "id": []}, "")]
CARTESIA_WRONG += [(("voice", "id"), v) for v in (NO_STORED_VOICE, "x" * 2000, "\u0000")]
CARTESIA_WRONG += [(("output_format",), v) for v in ("raw", [], 5, {})]
CARTESIA_WRONG += [(("output_format", "sample_rate"), v) for v in NUMBERS + [24000.5, "24000", None, [], 7]]
CARTESIA_WRONG += [(("output_format", "encoding"), v) for v in ("pcm_s8", 5, [], None, "")]
CARTESIA_WRONG += [(("output_format", "container"), v) for v in ("flac", "ogg", 5, [], "")]
CARTESIA_WRONG += [((k,), v) for k in ("model_id", "language") for v in (5, [], {})]
CARTESIA_WRONG += [(("model_id",), "no-such-model"), (("add_phoneme_timestamps",), True)]
CARTESIA_WRONG += [(("generation_config",), v) for v in ("x", [], 5)]
CARTESIA_WRONG += [(("generation_config", k), v) for k in ("speed", "volume") for v in ("fast", [], BIG, 1e308, -5)]
CARTESIA_WRONG += [(("generation_config", "emotion"), v) for v in (5, {}, "furious-beyond-words")]
CARTESIA_WRONG += [(("speed",), v) for v in ([], {}, BIG, "warp")]
CARTESIA_WRONG += [(("use_normalized_timestamps",), v) for v in ("yes", 5)]
CARTESIA_RAW_BIT_RATE = [(("output_format", "bit_rate"), v) for v in ("x", -1, BIG)]     # raw has none: ignored
CARTESIA_WRONG += [(("output_format",), {"container": "mp3", "sample_rate": 24000, "bit_rate": v})
                   for v in (1, 31999, 10 ** 9, "128000")]
CARTESIA_SSE_WRONG = [((k,), v) for k in ("context_id", "add_timestamps") for v in (5, [], {})]
CARTESIA_SSE_WRONG += [(("add_timestamps",), "yes")]

DEEPGRAM_Q = "/v1/speak?encoding=linear16&sample_rate=24000"
DEEPGRAM_QUERIES = [(f"sample_rate={v}", f"/v1/speak?encoding=linear16&sample_rate={v}") for v in
                    ("0", "-1", "1e400", "NaN", "99999999999999999999", "24000.0", "%C2%B2%C2%B4", "")]
DEEPGRAM_QUERIES += [(f"encoding={v}", f"/v1/speak?encoding={v}") for v in ("x", "", "LINEAR16", "pcm_s16le")]
DEEPGRAM_QUERIES += [(f"container={v}", f"{DEEPGRAM_Q}&container={v}") for v in ("ogg", "", "x")]
DEEPGRAM_QUERIES += [(f"bit_rate={v}", f"/v1/speak?encoding=mp3&bit_rate={v}") for v in ("1", "NaN", "1e400", "")]
DEEPGRAM_QUERIES += [(f"speed={v}", f"{DEEPGRAM_Q}&speed={v}")
                     for v in ("NaN", "Infinity", "1e400", "0", "99", "fast", "")]
DEEPGRAM_QUERIES += [(f"model={v}", f"{DEEPGRAM_Q}&model={v}") for v in ("nope", "%00", NO_STORED_VOICE,
                                                                         f"x:{NO_STORED_VOICE}", "::", "x" * 2000)]

DASHSCOPE_VALID = {"model": "qwen3-tts-flash", "input": {"text": "Hello there.", "voice": "Cherry"}}
DASHSCOPE_WRONG = [(("model",), v) for v in (5, [], {}, None, "", "no-such-model")]
DASHSCOPE_WRONG += [(("input",), v) for v in ("x", [], 5, None)]
DASHSCOPE_WRONG += [(("input", k), v) for k in ("voice", "language_type", "instructions") for v in (5, [], {})]
DASHSCOPE_WRONG += [(("input", "voice"), v) for v in ("no such voice", NO_STORED_VOICE, "x" * 2000)]
DASHSCOPE_WRONG += [(("parameters",), "x"), (("parameters",), [])]
DASHSCOPE_MAYBE = [(("parameters",), {"sample_rate": v, "stream": "yes", "seed": v}) for v in (BIG, -1, 1e308)]


def endpoints() -> list[Endpoint]:
    el = [Endpoint(f"elevenlabs {route or '(convert)'}", f"/v1/text-to-speech/ryan{route}{EL_QUERY}", EL_VALID,
                   ("text",), elevenlabs_error, numbers=EL_NUMBERS, wrong=EL_WRONG,
                   queries=[(w, f"/v1/text-to-speech/ryan{route}{q}") for w, q in EL_QUERIES]
                   + [(f"voice_id {v[:20]}", f"/v1/text-to-speech/{v}{route}{EL_QUERY}") for v in EL_VOICES],
                   first=not route)
          for route in ("", "/stream", "/with-timestamps", "/stream/with-timestamps")]
    cartesia = [Endpoint(f"cartesia {path}", path, {**CARTESIA_VALID, **({"context_id": "c1"} if sse else {})},
                         ("transcript",), cartesia_error, numbers=CARTESIA_NUMBERS,
                         wrong=CARTESIA_WRONG + (CARTESIA_SSE_WRONG if sse else []), maybe=CARTESIA_RAW_BIT_RATE,
                         first=not sse)
                for path, sse in (("/tts/bytes", False), ("/tts/sse", True))]
    deepgram = Endpoint("deepgram /v1/speak", DEEPGRAM_Q, {"text": "Hello there."}, ("text",), deepgram_error,
                        max_chars=2000, queries=DEEPGRAM_QUERIES)
    dashscope = [Endpoint(f"dashscope {how}", DASHSCOPE_PATH, DASHSCOPE_VALID, ("input", "text"), dashscope_error,
                          numbers=[("parameters", "sample_rate")], wrong=DASHSCOPE_WRONG, maybe=DASHSCOPE_MAYBE,
                          headers=headers, first=not headers)
                 for how, headers in (("(file)", {}), ("(SSE)", {"X-DashScope-SSE": "enable"}))]
    return el + cartesia + [deepgram] + dashscope


def route_cases() -> list[tuple[HttpRequest, object]]:
    """(request, the vendor's error shape): each vendor route (speech and voices) asked with a method it does not
    take, and each vendor WebSocket route without an upgrade. aiohttp refuses them before the route's handler
    answers (server/errors.py): still in the vendor's shape."""
    body = json.dumps({"text": "Hello."}).encode()
    routes = [(elevenlabs_error, "GET", "/v1/text-to-speech/ryan/stream"),
              (elevenlabs_error, "PUT", "/v1/text-to-speech/ryan"),
              (elevenlabs_error, "GET", "/v1/text-to-speech/ryan/stream-input"),
              (elevenlabs_error, "GET", "/v1/text-to-speech/ryan/multi-stream-input"),
              (elevenlabs_error, "POST", "/v1/text-to-speech/ryan/stream-input"),
              (cartesia_error, "GET", "/tts/bytes"), (cartesia_error, "GET", "/tts/websocket"),
              (cartesia_error, "DELETE", "/tts/sse"),
              (deepgram_error, "GET", "/v1/speak"), (deepgram_error, "PUT", "/v1/speak"),
              (deepgram_error, "GET", "/v2/speak"), (deepgram_error, "GET", "/v2/speak?model=flux-general-en"),
              (dashscope_error, "GET", DASHSCOPE_PATH), (dashscope_error, "GET", "/api-ws/v1/realtime"),
              (dashscope_error, "GET", "/api-ws/v1/realtime?model=qwen-tts-realtime"),
              (dashscope_error, "POST", "/api/v1/audio/x.wav"), (dashscope_error, "GET", "/api/v1/audio/x.wav"),
              # the voice APIs
              (elevenlabs_error, "PUT", "/v1/voices"), (elevenlabs_error, "GET", "/v1/voices/add"),
              (elevenlabs_error, "POST", "/v2/voices"), (cartesia_voice_error, "PUT", "/voices"),
              (cartesia_voice_error, "POST", "/voices/x")]
    return [(HttpRequest(f"{m} {p} (no such method, or no upgrade)", True, b"" if m == "GET" else body, method=m,
                         path=p), shape) for shape, m, p in routes]


def _raw(body: dict) -> bytes:
    return json.dumps(body).encode()


def _field_raw(ep: Endpoint, where: tuple[str, ...], json_value: bytes) -> bytes:
    """The valid body with a field's JSON replaced by raw bytes (what json.dumps cannot write)."""
    mark = "\u0001MARK\u0001"
    return _raw(set_path(ep.valid, where, mark)).replace(json.dumps(mark).encode(), json_value)


def _text_raw(ep: Endpoint, json_value: bytes) -> bytes:
    return _field_raw(ep, ep.text, json_value)


def cases(ep: Endpoint, max_chars: int, client_max: int) -> list[tuple[HttpRequest, str]]:
    """-> [(request, what must happen: SERVED, REFUSED or EITHER)]: the valid request first."""
    def req(what, body, headers=None, path=None):
        return HttpRequest(what, False, body, path=path or ep.path, headers={**ep.headers, **(headers or {})})

    limit = ep.max_chars or max_chars
    raw = _raw(ep.valid)
    out = [(req("the valid request", raw), SERVED)]
    bad = [("invalid JSON", raw[:-1]), ("invalid UTF-8 in the text", _text_raw(ep, b'"\xff\xfe hi \xc0\x80"')),
           ("an empty body", b""), ("a list body", b"[" + raw + b"]"), ("a scalar body", b"5"), ("null", b"null"),
           ("a string body", b'"hello"'), ("body nested 1000 deep", b"[" * 1000 + b"]" * 1000),
           ("body nested 100000 deep", b'{"a":' * 100000 + b"1" + b"}" * 100000),
           ("text nested 1000 deep", _text_raw(ep, b"[" * 1000 + b"]" * 1000)),
           ("lone surrogate in the text", _text_raw(ep, b'"\\ud800 hello"')),
           ("lone low surrogate in the text", _text_raw(ep, b'"hello \\udfff"')),
           ("a lone surrogate as a key", raw[:-1] + b', "\\udc00": 1}'),
           ("NUL after the body", raw + b"\x00"), ("two bodies", raw + raw),
           (f"text of {limit + 1} characters", _raw(set_path(ep.valid, ep.text, "x" * (limit + 1)))),
           ("text empty", _raw(set_path(ep.valid, ep.text, ""))), ("text blank", _raw(set_path(ep.valid, ep.text, " \n\t "))),
           ("no text", _raw(set_path(ep.valid, ep.text, None, delete=True)))]
    bad += [(f"text {json.dumps(v)[:20]}", _raw(set_path(ep.valid, ep.text, v))) for v in TYPES + [None] if v != "x"]
    bad += [(f"{'.'.join(w)} = {json.dumps(v)[:40]}", _raw(set_path(ep.valid, w, v))) for w, v in ep.wrong]
    bad += [(f"{'.'.join(w)} = {n.decode()[:20]}", _field_raw(ep, w, n))
            for w in [ep.text] + ep.numbers for n in NOT_JSON_NUMBERS]
    out += [(req(w, b), REFUSED) for w, b in bad]
    out += [(req(f"query {w}", raw, path=p), REFUSED) for w, p in ep.queries]
    gz = {"Content-Encoding": "gzip"}
    out += [(req("Content-Encoding gzip, body not gzip", raw, gz), REFUSED),
            (req("Content-Encoding deflate, body not deflate", raw, {"Content-Encoding": "deflate"}), REFUSED),
            (req("Content-Encoding br, body not brotli", raw, {"Content-Encoding": "br"}), BEFORE_ROUTING),
            (req("gzip twice, declared once", gzip.compress(gzip.compress(raw)), gz), REFUSED),
            (req(f"gzip body inflating past {client_max} bytes", gzip.compress(_raw(set_path(
                ep.valid, ep.text, "x" * (client_max + 10)))), gz), REFUSED),
            (req(f"a body of {client_max + 1} bytes", raw[:-1] + b" " * client_max + b"}"), REFUSED),
            (req("charset=bogus", raw, {"Content-Type": "application/json; charset=bogus"}), REFUSED),
            # aiohttp's 405, before the route's handler: in the route's shape too (server/errors.py)
            (HttpRequest("PUT on the route", False, raw, method="PUT", path=ep.path, headers=ep.headers), REFUSED)]
    if ep.first:        # what makes audio: once per vendor
        out += [(req(f"{'.'.join(w)} = {json.dumps(v)[:40]}", _raw(set_path(ep.valid, w, v))), EITHER)
                for w, v in ep.maybe]
        spoken = "Say " + " ".join(CONTROL_TOKENS) + " aloud."
        out += [(req("control tokens in the text", _raw(set_path(ep.valid, ep.text, spoken))), SERVED),
                (req("unknown fields", _raw({**ep.valid, "extra": [1, {"x": None}], "ключ": "v"})), SERVED),
                (req("gzip body", gzip.compress(raw), gz), SERVED)]
    return out


def audio_problem(ep: Endpoint, ctype: str, body: bytes) -> str | None:
    """Is a 200 answer audio in the endpoint's framing, with no in-band error? -> None when it is."""
    text = body.decode(errors="replace")
    try:
        if ctype.startswith("text/event-stream"):
            if "event:error" in text or "event: error" in text:
                return f"an error event: {text[:200]!r}"
            datas = [strict_json(line.split(":", 1)[1]) for line in text.split("\n") if line.startswith("data:")]
            audio = [d.get("data") or (d.get("output") or {}).get("audio", {}).get("data") for d in datas]
            return None if any(audio) else f"no audio event: {text[:200]!r}"
        if ctype.startswith("application/json"):
            lines = [strict_json(line) for line in text.splitlines() if line.strip()]
            if ep.vendor == "dashscope":
                return None if lines and lines[0]["output"]["audio"]["url"] else f"no audio URL: {text[:200]!r}"
            audio = b"".join(base64.b64decode(d["audio_base64"]) for d in lines)
            return None if audio else f"no audio: {text[:200]!r}"
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"malformed ({e!r}): {text[:200]!r}"
    return None if body and ctype.startswith("audio/") else f"{ctype} of {len(body)} bytes"


async def fuzz_vendor_http(camp, phase) -> None:
    """Every vendor's endpoints at once, each's cases in turn, one request per connection; the error shapes
    by vendor (the audio of the few requests served is made in one batch, not one after another)."""
    client_max = 4 * camp.max_message_bytes      # aiohttp's client_max_size on this server
    max_chars = await _max_text_chars(camp)
    shapes: dict[str, dict] = {}
    conn = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as s:
        by_vendor: dict[str, list[Endpoint]] = {}
        for ep in endpoints():
            by_vendor.setdefault(ep.vendor, []).append(ep)
        await asyncio.gather(*(_vendor(s, camp, phase, eps, max_chars, client_max, shapes)
                               for eps in by_vendor.values()))
    for vendor in shapes.values():
        judge_shapes(phase, vendor)


async def _vendor(s, camp, phase, eps: list[Endpoint], max_chars: int, client_max: int, shapes: dict) -> None:
    for ep in eps:
        for req, expect in cases(ep, max_chars, client_max):
            req.known_bad = expect in (REFUSED, BEFORE_ROUTING)
            status, ctype, body = await send_http(s, camp.server.url, req, camp.auth_headers)
            vendor, shape = ("talkgate", openai_error) if expect == BEFORE_ROUTING else (ep.vendor, ep.shape)
            judge_http(req, status, ctype, body, phase, shapes.setdefault(vendor, {}), shape)
            phase.counts[ep.vendor] += 1
            where = f"{ep.name}: {req.what[:120]}"
            if expect == SERVED and status != 200:
                phase.fail("HTTP valid request refused", f"{where} -> {status} {body[:200]!r}")
            elif expect == SERVED and (problem := audio_problem(ep, ctype, body)):
                phase.fail("HTTP valid request not audio", f"{where} -> {problem}")


async def _max_text_chars(camp) -> int:
    """The server's --max-text-chars, as ElevenLabs' model list gives it."""
    async with aiohttp.ClientSession() as s:
        async with s.get(camp.server.url + "/v1/models", headers=camp.auth_headers) as r:
            return (await r.json())[0]["maximum_text_length_per_request"]
