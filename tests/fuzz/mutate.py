"""Structure-aware mutation of valid messages, seeded.

Each protocol has seed *scripts* (short valid exchanges: start, text, flush, cancel ...) and a contract
per message kind: which fields it documents and what they take. A mutation changes one thing (a field's
value, a field, the raw JSON text, the frame type, the order of the script) and says whether the result
is *known bad*: it breaks the contract, so the server must answer it with the protocol's error. Where a
mutation may or may not be valid (a different but well-typed string, an unknown field, a reordered
script), it is not known bad: the server may accept it, but still never hang, close silently or fail.

    m = Mutator(random.Random(seed), NATIVE_PROTOCOL, max_message_bytes=16384)
    script = m.mutated_script(n)      # [Input(data, known_bad, what), ...]
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

DEEP = 1500                  # nesting beyond any sane parser's limit: must be refused
BIG = 10 ** 400              # a 401-digit number
SURROGATES = ("\ud800 hello", "hello \udfff", "\udc00\ud800", "x\ud83d")
CONTROL_TOKENS = ("<|im_end|>", "<tts_text_eod>", "<tts_pad>", "<|im_start|>assistant\n", "<tts_text_bos>",
                  "<|audio_start|>", "<|endoftext|>")
ODD_STRINGS = ("", " ", "héllo wörld", "日本語のテキストです", "مرحبا بالعالم", "\u200b\u200d\u2060", "\u0000nul", "🙂🙃🧪",
               "²", "١٢٣", "１６０００", "\\", "\"", "\n\t\r", "a" * 3000, "RYAN", "english", "null", "true", "0")
ODD_NUMBERS = (0, -1, 1, 2 ** 31, 2 ** 63, 2 ** 64, -(2 ** 63) - 1, BIG, -BIG, 1.5, -0.0, 1e308, 5e-324, 100000, 100001)
ODD_VALUES = (None, True, False, [], ["x"], [1, 2], {}, {"k": "v"}) + ODD_NUMBERS[:8] + ("x", "", "\ud800 hello")
KEYS = ("extra", "ключ", "キー", "\ud800", "", "TYPE", "type ", "context_id\u0000", "🙂", "k" * 300, "__proto__")
NAN = ("NaN", "Infinity", "-Infinity")
DEEP_MARK = "\u0001DEEP\u0001"


# ----- contracts -----
@dataclass(frozen=True)
class F:
    """What one field takes. kind: str text cid bool int num enum obj list any; `required`; range lo..hi
    (lo_open: lo excluded) and `step` (a number must be a multiple of it); `values` for enum; `sub` and
    `closed` (unknown keys refused) for obj; `item` for list (a list that must not be empty, each item `item`)."""
    kind: str
    required: bool = False
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    values: tuple = ()
    sub: dict | None = None
    closed: bool = False
    max_len: int | None = None
    step: float | None = None
    item: "F | None" = None

    def breaks(self, v) -> bool:
        """Is `v` outside this contract (None: the field is absent)?"""
        if v is None:
            return self.required
        k = self.kind
        if k in ("str", "text", "cid", "enum") and _has_surrogate(v):
            return True     # a lone surrogate is never text (objects: their known fields say)
        if k == "any":
            return False
        if k in ("str", "text"):
            return not isinstance(v, str) or (self.max_len is not None and len(v) > self.max_len) or \
                (self.required and k == "str" and not v)
        if k == "cid":
            return not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9_.:\-]{1,64}", v)
        if k == "bool":
            return not isinstance(v, bool)
        if k in ("int", "num"):
            if isinstance(v, bool) or not isinstance(v, (int, float) if k == "num" else int):
                return True
            if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
                return True
            if self.hi is not None and v > self.hi:
                return True
            return self.step is not None and abs(v / self.step - round(v / self.step)) > 1e-6
        if k == "enum":
            return not any(type(v) is type(x) and v == x for x in self.values)
        if k == "list":
            return not isinstance(v, list) or not v or any(self.item.breaks(x) for x in v)
        if k == "obj":
            if not isinstance(v, dict):
                return True
            sub = self.sub or {}
            if self.closed and any(key not in sub for key in v):
                return True
            return any(c.breaks(v.get(key)) for key, c in sub.items())
        raise ValueError(k)


def _has_surrogate(v) -> bool:
    if isinstance(v, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    if isinstance(v, list):
        return any(_has_surrogate(x) for x in v)
    if isinstance(v, dict):
        return any(_has_surrogate(x) for x in v.values())
    return False


SCHEMA_RATES = (8000, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
FORMAT = F("obj", sub={"encoding": F("enum", values=("opus", "pcm_s16le", "pcm_f32le", "mulaw", "alaw")),
                       "sample_rate": F("enum", values=SCHEMA_RATES)}, closed=True)
SAMPLING = F("obj", closed=True, sub={
    "greedy": F("bool"), "temperature": F("num", lo=0, hi=5, lo_open=True), "top_k": F("int", lo=0, hi=3072),
    "top_p": F("num", lo=0, hi=1, lo_open=True), "repetition_penalty": F("num", lo=0.5, hi=2),
    "seed": F("int", lo=-(2 ** 63), hi=2 ** 64 - 1)})
SPEED = F("num", lo=0.25, hi=4)


@dataclass
class Protocol:
    """Seed scripts and contracts of one wire protocol."""
    name: str
    scripts: list            # each: a list of message dicts; "{C}" in a string is replaced by a fresh id
    contracts: dict          # message kind -> {field: F}
    kind_of: callable        # message -> its kind (a key of contracts) or None (unknown kind: known bad)
    type_field: str | None = None
    unknown_kind_bad: bool = True
    needs: callable = None   # message -> True when it lacks what every message of the protocol needs
    opener_only: tuple = ()  # fields checked only by a context's first message (Cartesia voice, format)


def _native_kind(msg):
    t = msg.get("type")
    return t if isinstance(t, str) and t in NATIVE_CONTRACTS else None


NATIVE_CONTRACTS = {
    "session.config": {"voice": F("str"), "language": F("str"), "instructions": F("str"), "format": FORMAT,
                       "sampling": SAMPLING, "speed": SPEED, "audio_transport": F("enum", values=("binary", "base64"))},
    "context.start": {"context_id": F("cid", True), "voice": F("str"), "language": F("str"), "instructions": F("str"),
                      "format": FORMAT, "sampling": SAMPLING, "speed": SPEED,
                      "fixed_frames": F("int", lo=1, hi=100_000)},
    "text": {"context_id": F("cid", True), "text": F("text", True)},
    "flush": {"context_id": F("cid", True)},
    "cancel": {"context_id": F("cid")},
    "ping": {"id": F("any")},
    "close": {},
}
NATIVE_SCRIPTS = [
    [{"type": "session.config", "voice": "ryan", "language": "auto", "speed": 1.0, "audio_transport": "binary",
      "format": {"encoding": "pcm_s16le", "sample_rate": 24000},
      "sampling": {"seed": 7, "temperature": 0.9, "top_k": 50, "top_p": 0.9, "repetition_penalty": 1.05}}],
    [{"type": "context.start", "context_id": "{C}", "fixed_frames": 3, "format": {"encoding": "opus", "sample_rate": 48000},
      "sampling": {"greedy": True}},
     {"type": "text", "context_id": "{C}", "text": "Hello there."}, {"type": "flush", "context_id": "{C}"}],
    [{"type": "text", "context_id": "{C}", "text": "Streaming "}, {"type": "text", "context_id": "{C}", "text": "words."},
     {"type": "flush", "context_id": "{C}"}],
    [{"type": "context.start", "context_id": "{C}", "voice": "vivian", "speed": 1.5, "fixed_frames": 4},
     {"type": "text", "context_id": "{C}", "text": "Quick."}, {"type": "cancel", "context_id": "{C}"}],
    [{"type": "ping", "id": 1}],
    [{"type": "session.config", "audio_transport": "base64"},
     {"type": "context.start", "context_id": "{C}", "fixed_frames": 2, "format": {"encoding": "mulaw", "sample_rate": 8000}},
     {"type": "text", "context_id": "{C}", "text": "Base64 audio."}, {"type": "flush", "context_id": "{C}"},
     {"type": "session.config", "audio_transport": "binary"}],
    [{"type": "context.start", "context_id": "{C}", "fixed_frames": 2, "language": "english"},
     {"type": "text", "context_id": "{C}", "text": "Bye."}, {"type": "flush", "context_id": "{C}"}, {"type": "cancel"}],
]
NATIVE_PROTOCOL = Protocol("native", NATIVE_SCRIPTS, NATIVE_CONTRACTS, _native_kind, type_field="type")


def _twilio_kind(msg):
    return _native_kind(msg)


TWILIO_CONTRACTS = {k: {f: c for f, c in v.items() if f not in ("format", "audio_transport")}
                    for k, v in NATIVE_CONTRACTS.items()}
TWILIO_PROTOCOL = Protocol(
    "twilio", [[m for m in s if "format" not in m and "audio_transport" not in m]
               for s in NATIVE_SCRIPTS if any("format" not in m and "audio_transport" not in m for m in s)],
    TWILIO_CONTRACTS, _twilio_kind, type_field="type",
    needs=lambda m: "format" in m or "audio_transport" in m)      # the Twilio mode refuses both


# voice_settings and generation_config are checked on every message (sessions/elevenlabs.py); a style above 0 is an
# instruction, refused (expression_unsupported) when a context opens on a checkpoint without instructions, as the
# fuzz servers' tiny checkpoint is: there 0 is the one valid style (below 1e-9: expression.py's STYLE_BANDS take a
# style that small for 0); the seeds carry these in openers only
EL_VOICE_SETTINGS = F("obj", sub={
    "stability": F("num", lo=0, hi=1), "similarity_boost": F("num", lo=0, hi=1), "use_speaker_boost": F("bool"),
    "speed": F("num", lo=0.7, hi=1.2), "style": F("num", lo=0, hi=0.999e-9)})
EL_GENERATION_CONFIG = F("obj", sub={"chunk_length_schedule": F("list", item=F("int", lo=50, hi=500))})
EL_COMMON = {"text": F("text"), "flush": F("bool"), "voice_settings": EL_VOICE_SETTINGS,
             "generation_config": EL_GENERATION_CONFIG}
EL_MULTI_CONTRACTS = {"message": {**EL_COMMON, "context_id": F("str"), "close_context": F("bool")}}
EL_MULTI_SCRIPTS = [
    [{"text": " ", "context_id": "{C}", "voice_settings": {"stability": 0.5, "similarity_boost": 0.8, "speed": 1.1,
                                                           "style": 0, "use_speaker_boost": True},
      "generation_config": {"chunk_length_schedule": [50, 120, 500]}},
     {"text": "Hello from the fuzzer. ", "context_id": "{C}"}, {"context_id": "{C}", "flush": True},
     {"context_id": "{C}", "close_context": True}],
    [{"text": "Barge in soon ", "context_id": "{C}"}, {"context_id": "{C}", "close_context": True}],
    [{"text": "", "context_id": "{C}"}],
    [{"text": "Flushed at once.", "context_id": "{C}", "flush": True}, {"context_id": "{C}", "close_context": True}],
]


def _el_multi_needs(m) -> bool:
    if m.get("close_socket") is True:
        return False
    cid = m.get("context_id")
    if cid is None:
        return not (m.get("text") == "" and not m.get("flush") and m.get("close_context") is None)
    return m.get("text") is None and not m.get("flush") and not m.get("close_context")


EL_MULTI_PROTOCOL = Protocol("elevenlabs-multi", EL_MULTI_SCRIPTS, EL_MULTI_CONTRACTS, lambda m: "message",
                             needs=_el_multi_needs)
EL_SINGLE_CONTRACTS = {"message": dict(EL_COMMON)}
EL_SINGLE_SCRIPTS = [
    [{"text": " ", "voice_settings": {"stability": 0.5, "speed": 0.8}, "generation_config": {"chunk_length_schedule": [120]}},
     {"text": "Hello single stream. "}, {"text": "More text.", "flush": True}],
    [{"text": "One message only.", "flush": True}],
]
EL_SINGLE_PROTOCOL = Protocol("elevenlabs-single", EL_SINGLE_SCRIPTS, EL_SINGLE_CONTRACTS, lambda m: "message",
                              needs=lambda m: m.get("text") is None and not m.get("flush"))

CARTESIA_FORMAT = F("obj", True, sub={"container": F("enum", values=("raw",)),
                                      "encoding": F("enum", True, values=("pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw")),
                                      "sample_rate": F("enum", True, values=(8000, 16000, 22050, 24000, 44100, 48000))})
CARTESIA_CONTRACTS = {"message": {
    "context_id": F("str", True), "transcript": F("text"), "continue": F("bool"), "flush": F("bool"),
    "add_timestamps": F("bool"), "cancel": F("bool"), "language": F("str"),
    "voice": F("obj", True, sub={"mode": F("enum", values=("id",)), "id": F("str", True)}),
    "output_format": CARTESIA_FORMAT,
    # a context's delivery, read from its first request (sessions/cartesia.py controls); emotions other than neutral
    # are instructions, refused (expression_unsupported) on the fuzz servers' checkpoint, which takes none
    "generation_config": F("obj", sub={"speed": F("num", lo=0.6, hi=1.5), "volume": F("num", lo=0.5, hi=2),
                                       "emotion": F("enum", values=("neutral",))}),
    "speed": F("enum", values=("slow", "normal", "fast")), "max_buffer_delay_ms": F("int", lo=0, hi=5000),
    "use_normalized_timestamps": F("bool"), "add_phoneme_timestamps": F("enum", values=(False,))}}
_CV = {"mode": "id", "id": "ryan"}
CARTESIA_SCRIPTS = [
    [{"context_id": "{C}", "model_id": "sonic-2", "transcript": "Hello ", "voice": _CV, "language": "en",
      "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
      "continue": True, "add_timestamps": True, "max_buffer_delay_ms": 3000, "use_normalized_timestamps": True,
      "generation_config": {"speed": 1.2, "volume": 1.5, "emotion": "neutral"}},
     {"context_id": "{C}", "transcript": "world.", "continue": True, "flush": True},
     {"context_id": "{C}", "transcript": "", "continue": False}],
    [{"context_id": "{C}", "model_id": "sonic-2", "transcript": "Cancel me.", "voice": _CV, "continue": True,
      "output_format": {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 16000}},
     {"context_id": "{C}", "cancel": True}],
    [{"context_id": "{C}", "transcript": "One shot.", "voice": _CV, "continue": False, "speed": "fast",
      "add_phoneme_timestamps": False, "output_format": {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000}}],
]
CARTESIA_PROTOCOL = Protocol("cartesia", CARTESIA_SCRIPTS, CARTESIA_CONTRACTS, lambda m: "message",
                             opener_only=("voice", "output_format", "language", "generation_config", "speed",
                                          "max_buffer_delay_ms", "use_normalized_timestamps",
                                          "add_phoneme_timestamps"))


def _deepgram_kind(msg):
    t = msg.get("type")
    return t if isinstance(t, str) and t in DEEPGRAM_CONTRACTS else None


DEEPGRAM_CONTRACTS = {"Speak": {"text": F("text", True, max_len=2000)}, "Flush": {}, "Clear": {}, "Close": {}}
DEEPGRAM_SCRIPTS = [
    [{"type": "Speak", "text": "Hello from Deepgram mode."}, {"type": "Flush"}],
    [{"type": "Speak", "text": "Interrupted "}, {"type": "Clear"}],
    [{"type": "Speak", "text": "Part one. "}, {"type": "Speak", "text": "Part two."}, {"type": "Flush"}, {"type": "Clear"}],
]
DEEPGRAM_PROTOCOL = Protocol("deepgram", DEEPGRAM_SCRIPTS, DEEPGRAM_CONTRACTS, _deepgram_kind, type_field="type")

def _deepgram_v2_kind(msg):
    t = msg.get("type")
    return t if isinstance(t, str) and t in DEEPGRAM_V2_CONTRACTS else None


# Flux: Clear is /v1/speak's (an unknown type here); a refused Configure is a ConfigureFailure, an error all the same
DEEPGRAM_V2_CONTRACTS = {
    "Speak": {"text": F("text", True, max_len=2000)}, "Flush": {}, "Close": {},
    "Interrupt": {"playback_offset": F("obj", sub={"type": F("enum", values=("time_ms",)),
                                                   "value": F("int", True, lo=0)})},
    "Configure": {"speed": F("num", lo=0.5, hi=1.5, step=0.05)}}
DEEPGRAM_V2_SCRIPTS = [
    [{"type": "Speak", "text": "Hello from Flux. "}, {"type": "Flush"}],
    [{"type": "Configure", "speed": 1.25}, {"type": "Speak", "text": "Faster now, "}, {"type": "Speak", "text": "two parts."},
     {"type": "Flush"}, {"type": "Interrupt"}],
    [{"type": "Speak", "text": "Heard up to here. "}, {"type": "Flush"},
     {"type": "Interrupt", "playback_offset": {"type": "time_ms", "value": 120}}],
    [{"type": "Speak", "text": "Last words."}, {"type": "Close"}],
]
DEEPGRAM_V2_PROTOCOL = Protocol("deepgram-v2", DEEPGRAM_V2_SCRIPTS, DEEPGRAM_V2_CONTRACTS, _deepgram_v2_kind,
                                type_field="type")


def _dashscope_kind(msg):
    t = msg.get("type")
    return t if isinstance(t, str) and t in DASHSCOPE_CONTRACTS else None


DASHSCOPE_SESSION = F("obj", sub={
    "voice": F("str"), "mode": F("enum", values=("server_commit", "commit")),
    "response_format": F("enum", values=("pcm", "wav", "mp3", "opus")),
    "sample_rate": F("enum", values=(8000, 16000, 22050, 24000, 44100, 48000)),
    "speech_rate": F("num", lo=0.5, hi=2), "volume": F("int", lo=0, hi=100), "pitch_rate": F("num", lo=0.5, hi=2),
    "bit_rate": F("int", lo=6, hi=510), "language_type": F("str"), "instructions": F("str")})
# an empty commit, a cancel with nothing in progress and session.update after the first text are refused too:
# errors that depend on what came before, not on the message
DASHSCOPE_CONTRACTS = {
    "session.update": {"session": DASHSCOPE_SESSION}, "input_text_buffer.append": {"text": F("text", True)},
    "input_text_buffer.commit": {}, "input_text_buffer.clear": {}, "response.cancel": {}, "session.finish": {}}
DASHSCOPE_SCRIPTS = [
    [{"type": "session.update", "session": {"voice": "Cherry", "mode": "server_commit", "response_format": "pcm",
                                            "sample_rate": 24000, "speech_rate": 1.2, "volume": 50, "pitch_rate": 1.0,
                                            "language_type": "English", "instructions": "Calm."}},
     {"type": "input_text_buffer.append", "text": "Hello from DashScope mode."}, {"type": "input_text_buffer.commit"}],
    [{"type": "session.update", "session": {"mode": "commit", "response_format": "mp3", "bit_rate": 64}},
     {"type": "input_text_buffer.append", "text": "Committed "}, {"type": "input_text_buffer.append", "text": "text."},
     {"type": "input_text_buffer.commit"}, {"type": "response.cancel"}],
    [{"type": "input_text_buffer.append", "text": "Streaming "}, {"type": "input_text_buffer.append", "text": "words."},
     {"type": "input_text_buffer.clear"}],
    [{"type": "input_text_buffer.append", "text": "Finish me."}, {"type": "session.finish"}],
]
DASHSCOPE_PROTOCOL = Protocol("dashscope", DASHSCOPE_SCRIPTS, DASHSCOPE_CONTRACTS, _dashscope_kind, type_field="type")

HTTP_CONTRACT = {
    "input": F("text", True, max_len=4096), "model": F("str"), "voice": F("str"),
    "response_format": F("enum", values=("pcm", "wav", "mp3", "opus", "flac")), "speed": SPEED,
    "stream": F("bool"), "stream_format": F("enum", values=("audio", "sse")), "language": F("str"),
    "instructions": F("str"), "seed": F("int", lo=-(2 ** 63), hi=2 ** 64 - 1), "fixed_frames": F("int", lo=1, hi=100_000),
    "non_streaming_mode": F("enum", values=(False,))}
HTTP_SEEDS = [
    {"model": "tts-1", "input": "Hello over HTTP.", "voice": "ryan", "response_format": "pcm", "stream": True,
     "stream_format": "audio", "fixed_frames": 3, "seed": 1},
    {"input": "Whole file.", "response_format": "wav", "fixed_frames": 2},
    {"input": "Server-sent events.", "response_format": "pcm", "stream": True, "stream_format": "sse", "fixed_frames": 2,
     "speed": 1.25},
    {"input": "MP3 please.", "response_format": "mp3", "fixed_frames": 2, "language": "english"},
]


# ----- inputs -----
@dataclass
class Input:
    data: str | bytes        # a text frame (str) or a binary frame (bytes)
    known_bad: bool
    what: str                # how it was made, for reports
    normal_end: bool = False  # it asks the server to end the connection (close, close_socket, "" ...)


def _dumps(obj, rng: random.Random) -> str:
    # a lone surrogate (in a value or a key) only travels escaped
    ascii_only = _has_surrogate(obj) or any(_has_surrogate(k) for k in _keys(obj)) or rng.random() < 0.5
    text = json.dumps(obj, ensure_ascii=ascii_only)
    return text.replace(json.dumps(DEEP_MARK), "[" * DEEP + "]" * DEEP)


def _keys(obj) -> list[str]:
    if isinstance(obj, dict):
        return list(obj) + [k for v in obj.values() for k in _keys(v)]
    if isinstance(obj, list):
        return [k for v in obj for k in _keys(v)]
    return []


def _paths(obj, prefix=()) -> list[tuple]:
    """Every key path into a message, nested objects included."""
    out = []
    for k, v in obj.items():
        out.append(prefix + (k,))
        if isinstance(v, dict):
            out += _paths(v, prefix + (k,))
    return out


def _get(obj, path):
    for k in path:
        if not isinstance(obj, dict) or k not in obj:
            return None
        obj = obj[k]
    return obj


def set_path(obj, path, value, delete=False):
    """A copy of JSON `obj` with the field at `path` set to `value` (objects on the way made where missing) or
    deleted."""
    obj = json.loads(json.dumps(obj))
    cur = obj
    for k in path[:-1]:
        cur = cur.setdefault(k, {})
    if delete:
        cur.pop(path[-1], None)
    else:
        cur[path[-1]] = value
    return obj


class Mutator:
    def __init__(self, rng: random.Random, protocol: Protocol, max_message_bytes: int):
        self.rng, self.p, self.max_bytes = rng, protocol, max_message_bytes
        self.ids = 0

    # ----- scripts -----
    def script(self) -> list[dict]:
        """A seed script with fresh context ids."""
        self.ids += 1
        raw = json.dumps(self.rng.choice(self.p.scripts)).replace("{C}", f"f{self.ids}")
        return json.loads(raw)

    def mutated_script(self) -> tuple[list[Input], list[str]]:
        """A seed script with one mutation; -> (inputs, the context ids it uses)."""
        msgs = self.script()
        ids = sorted({m.get("context_id") for m in msgs if isinstance(m.get("context_id"), str)})
        r = self.rng.random()
        if r < 0.12 and len(msgs) > 1:
            return self._sequence(msgs), ids
        i = self.rng.randrange(len(msgs))
        inputs = [self._plain(m) for m in msgs]
        inputs[i] = self.mutate(msgs[i], opener=(i == 0))
        return inputs, ids

    def _plain(self, m: dict) -> Input:
        return Input(_dumps(m, self.rng), False, "valid " + json.dumps(m)[:100], normal_end=self._ends(m))

    def _ends(self, m: dict) -> bool:
        return (m.get("type") in ("close", "Close", "session.finish") or m.get("close_socket") is True
                or (self.p.name == "elevenlabs-single" and m.get("text") == "" and not m.get("flush")))

    def _sequence(self, msgs: list[dict]) -> list[Input]:
        op = self.rng.choice(("drop", "duplicate", "swap"))
        i = self.rng.randrange(len(msgs))
        if op == "drop":
            msgs = msgs[:i] + msgs[i + 1:]
        elif op == "duplicate":
            msgs = msgs[:i + 1] + msgs[i:]
        else:
            j = self.rng.randrange(len(msgs))
            msgs[i], msgs[j] = msgs[j], msgs[i]
        return [Input(_dumps(m, self.rng), False, f"script with a message {op}ped: " + json.dumps(m)[:80],
                      normal_end=self._ends(m)) for m in msgs]

    # ----- one message -----
    def mutate(self, msg: dict, opener: bool = True) -> Input:
        ops = [(self.set_field, 6), (self.delete_field, 2), (self.add_field, 2), (self.kind_swap, 1),
               (self.truncate, 2), (self.corrupt, 2), (self.nan, 1), (self.deep, 1), (self.not_object, 1),
               (self.oversize, 1), (self.binary, 1), (self.bom, 1), (self.duplicate_key, 1)]
        op = self.rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
        return op(msg, opener)

    def _contract(self, msg: dict):
        kind = self.p.kind_of(msg)
        return None if kind is None else self.p.contracts[kind]

    def _bad(self, msg: dict, opener: bool) -> bool:
        """Does this (well-formed JSON object) message break its protocol's contract?"""
        contract = self._contract(msg)
        if contract is None:
            return self.p.unknown_kind_bad
        if self.p.needs is not None and self.p.needs(msg):
            return True
        for k, c in contract.items():
            if k in self.p.opener_only and not opener:
                continue
            if c.breaks(msg.get(k)):
                return True
        return False

    def _field_input(self, msg, new, opener, what) -> Input:
        return Input(_dumps(new, self.rng), self._bad(new, opener), what + " in " + json.dumps(msg)[:100],
                     normal_end=self._ends(new))

    def set_field(self, msg, opener) -> Input:
        paths = _paths(msg)
        if not paths:
            return self.add_field(msg, opener)
        path = self.rng.choice(paths)
        old = _get(msg, path)
        pool = (SURROGATES + CONTROL_TOKENS + ODD_STRINGS if isinstance(old, str) else
                ODD_NUMBERS if isinstance(old, (int, float)) and not isinstance(old, bool) else ODD_VALUES)
        pool = pool + ODD_VALUES if self.rng.random() < 0.3 else pool
        value = self.rng.choice(pool)
        return self._field_input(msg, set_path(msg, path, value), opener, f"{'.'.join(path)}={_show(value)}")

    def delete_field(self, msg, opener) -> Input:
        paths = _paths(msg)
        if not paths:
            return self.add_field(msg, opener)
        path = self.rng.choice(paths)
        return self._field_input(msg, set_path(msg, path, None, delete=True), opener, f"without {'.'.join(path)}")

    def add_field(self, msg, opener) -> Input:
        where = self.rng.choice([()] + [p for p in _paths(msg) if isinstance(_get(msg, p), dict)])
        key, value = self.rng.choice(KEYS), self.rng.choice(ODD_VALUES)
        new = set_path(msg, where + (key,), value)
        bad = self._bad(new, opener)
        if where:       # a closed object (format, sampling) refuses unknown keys
            top = self._contract(msg) or {}
            c = top.get(where[0])
            bad = bad or (c is not None and c.closed and key not in (c.sub or {}))
        return Input(_dumps(new, self.rng), bad, f"added {'.'.join(where + (key,))!r}={_show(value)} to "
                     + json.dumps(msg)[:100], normal_end=self._ends(new))

    def kind_swap(self, msg, opener) -> Input:
        if self.p.type_field is None:
            return self.set_field(msg, opener)
        value = self.rng.choice(list(self.p.contracts) + ["dance", "", "TEXT", "Speak ", 5, None, ["text"]])
        new = set_path(msg, (self.p.type_field,), value)
        return self._field_input(msg, new, opener, f"type={_show(value)}")

    def truncate(self, msg, opener) -> Input:
        text = _dumps(msg, self.rng)
        cut = text[:self.rng.randrange(1, len(text))]
        return self._raw_input(cut, opener, f"truncated to {cut[:100]!r}")

    def corrupt(self, msg, opener) -> Input:
        text = list(_dumps(msg, self.rng))
        for _ in range(self.rng.randint(1, 3)):
            i = self.rng.randrange(len(text))
            op = self.rng.random()
            junk = self.rng.choice(['"', "{", "}", "[", ",", ":", "\\", "x", "\u00e9", " ", "0", "'", "\u2028"])
            if op < 0.4:
                text[i] = junk
            elif op < 0.7:
                text.insert(i, junk)
            else:
                del text[i]
        out = "".join(text)
        return self._raw_input(out, opener, f"corrupted to {out[:100]!r}")

    def _raw_input(self, text: str, opener: bool, what: str) -> Input:
        """Damaged JSON text, judged by what it parses to: bad if it does not parse or breaks the contract, an
        end if it still asks for one (a corrupted ElevenLabs opener " " can become the end "")."""
        if not _valid_json(text):
            return Input(text, True, what)
        obj = json.loads(text)
        if not isinstance(obj, dict):
            return Input(text, True, what)
        return Input(text, self._bad(obj, opener), what, normal_end=self._ends(obj))

    def nan(self, msg, opener) -> Input:
        path = self.rng.choice(_paths(msg) or [("n",)])
        lit = self.rng.choice(NAN)
        text = _dumps(set_path(msg, path, DEEP_MARK), self.rng).replace("[" * DEEP + "]" * DEEP, lit)
        return Input(text, True, f"{'.'.join(path)}={lit} in " + json.dumps(msg)[:100])

    def deep(self, msg, opener) -> Input:
        if self.rng.random() < 0.5:
            text = "[" * DEEP + _dumps(msg, self.rng) + "]" * DEEP
            return Input(text, True, f"message wrapped {DEEP} lists deep")
        path = self.rng.choice(_paths(msg) or [("deep",)])
        return Input(_dumps(set_path(msg, path, DEEP_MARK), self.rng), True, f"{'.'.join(path)} nested {DEEP} deep")

    def not_object(self, msg, opener) -> Input:
        text = self.rng.choice([json.dumps([msg]), "5", '"text"', "null", "true", "[]", "{}" if False else "[{}]"])
        return Input(text, True, f"not an object: {text[:80]!r}")

    def oversize(self, msg, opener) -> Input:
        text = _dumps(msg, self.rng)
        pad = self.max_bytes - len(text.encode()) + 1 + self.rng.randrange(0, 2 * self.max_bytes)
        return Input(text + " " * pad, True, f"{len(text) + pad} bytes (limit {self.max_bytes})")

    def binary(self, msg, opener) -> Input:
        return Input(_dumps(msg, self.rng).encode("utf-8", "surrogatepass"), True, "as a binary frame")

    def bom(self, msg, opener) -> Input:
        return Input("\ufeff" + _dumps(msg, self.rng), False, "with a byte-order mark", normal_end=self._ends(msg))

    def duplicate_key(self, msg, opener) -> Input:
        text = _dumps(msg, self.rng)
        if not msg:
            return Input(text, self._bad(msg, opener), "empty object")
        key = self.rng.choice(list(msg))
        value = self.rng.choice(ODD_VALUES[:8])
        dup = text[:-1] + ("," if len(text) > 2 else "") + json.dumps(key) + ":" + json.dumps(value) + "}"
        return Input(dup, False, f"duplicate key {key!r}={_show(value)}", normal_end=self._ends(json.loads(dup)))


def _valid_json(text: str) -> bool:
    try:
        json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        return True
    except (ValueError, RecursionError):
        return False


def _show(v) -> str:
    s = json.dumps(v) if not isinstance(v, int) or abs(v) < 10 ** 20 else f"<{len(str(abs(v)))}-digit int>"
    return s if len(s) < 60 else s[:40] + f"...({len(s)} chars)"
