"""Cartesia TTS, Sans-I/O, onto `Session`: the WebSocket (`/tts/websocket`) and the HTTP endpoints
(`/tts/bytes`, `/tts/sse`: sessions/http.py).

A Cartesia context is one utterance (sessions/utterances.py): its generation requests' transcripts
concatenate verbatim; `continue: false` ends its input; `flush: true` speaks what came so far and is
answered with `flush_done` once that audio is out; `cancel` stops it at once (queued audio purged,
nothing more is sent for it). Every server message carries `context_id` and a `type`; after a
context's `done` nothing more is sent for it. Word timestamps are estimates (sessions/alignment.py).
"""
from __future__ import annotations

import base64

from talkgate.codecs import ENCODINGS as CODECS
from talkgate.sessions.actions import BUSY, Close, Send, dumps, http_status, send_json
from talkgate.sessions.alignment import Timeline
from talkgate.sessions.expression import emotion_phrase
from talkgate.sessions.fields import SessionError, field_of, integer, number, show
from talkgate.sessions.http import HttpSpeech, Respond, new_request_id, sse
from talkgate.sessions.models import Models
from talkgate.sessions.session import (
    AudioFormat, AudioOut, ContextCancelled, ContextError, ContextFinished, Session,
)
from talkgate.sessions.utterances import (
    Audio, Event, SegmentDone, UtteranceDone, UtteranceProtocol,
)
from talkgate.sessions.voices import UnknownVoice, VoiceMap, resolve_language

ENCODINGS = {"pcm_s16le": "pcm_s16le", "pcm_f32le": "pcm_f32le", "pcm_mulaw": "mulaw", "pcm_alaw": "alaw"}
PCM_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
MP3_BITRATES = (32000, 64000, 96000, 128000, 192000)
STATUS = 206
SPEEDS = {"slow": 0.8, "normal": 1.0, "fast": 1.2}  # the older top-level `speed` (Sonic-2) as a tempo
MAX_BUFFER_DELAY_MS = 5000




def parse_output_format(fmt: object, cid: str | None, containers: tuple[str, ...] = ("raw",)) -> AudioFormat:
    """`output_format` -> the session's format; `containers`: those the endpoint takes (the WebSocket:
    raw; HTTP: raw, wav with pcm_s16le, mp3 with bit_rate)."""
    if not isinstance(fmt, dict):
        raise SessionError("invalid_output_format", "output_format must be an object with container, encoding "
                           "and sample_rate", cid)
    container, enc, rate = fmt.get("container", "raw"), fmt.get("encoding"), fmt.get("sample_rate")
    if container not in containers:
        raise SessionError("invalid_output_format", f"container {show(container)} is not supported here: use "
                           f"{' or '.join(map(repr, containers))}", cid)
    if container == "mp3":
        bitrate = fmt.get("bit_rate", 128000)
        if not isinstance(rate, int) or isinstance(rate, bool) or rate not in PCM_RATES:
            raise SessionError("invalid_output_format", f"sample_rate {show(rate)} is not supported: use "
                               f"{', '.join(map(str, PCM_RATES))}", cid)
        if not isinstance(bitrate, int) or isinstance(bitrate, bool) or bitrate not in MP3_BITRATES:
            raise SessionError("invalid_output_format", f"bit_rate {show(bitrate)} is not supported: use "
                               f"{', '.join(map(str, MP3_BITRATES))}", cid)
        return AudioFormat("mp3", rate, bitrate=bitrate)
    if container == "wav" and enc != "pcm_s16le":
        raise SessionError("invalid_output_format", f"the wav container holds pcm_s16le here, not {show(enc)}", cid)
    if not isinstance(enc, str) or enc not in ENCODINGS:
        raise SessionError("invalid_output_format", f"encoding {show(enc)} is not supported: use "
                           f"{', '.join(ENCODINGS)}", cid)
    rates = (8000,) if enc in ("pcm_mulaw", "pcm_alaw") else PCM_RATES
    if not isinstance(rate, int) or isinstance(rate, bool) or rate not in rates:
        raise SessionError("invalid_output_format", f"sample_rate {show(rate)} is not supported for {enc}: use "
                           f"{', '.join(map(str, rates))}", cid)
    return AudioFormat("wav" if container == "wav" else ENCODINGS[enc], rate)


def voice_id(voice: object, cid: str | None) -> str:
    """`voice`: an id, {"id": ...} or {"mode": "id", "id": ...}; embeddings are refused."""
    if isinstance(voice, str) and voice:
        return voice
    if isinstance(voice, dict) and voice.get("mode") == "embedding":
        raise SessionError("invalid_voice", "voice embeddings are not supported: use {\"mode\": \"id\"}", cid)
    if (not isinstance(voice, dict) or voice.get("mode", "id") != "id" or not isinstance(voice.get("id"), str)
            or not voice["id"]):
        raise SessionError("invalid_voice", "voice must be a voice id, {\"id\": \"<voice id>\"} or "
                           "{\"mode\": \"id\", \"id\": \"<voice id>\"}", cid)
    return voice["id"]


def controls(msg: dict, cid: str | None) -> dict:
    """A generation request's delivery controls as ContextConfig fields: `generation_config` {speed (0.6 to 1.5: a
    pitch-kept tempo), volume (0.5 to 2: a gain), emotion (an instruction phrase: expression.py)}, the older
    top-level `speed` (slow, normal, fast); and the fields checked and met as they stand: `max_buffer_delay_ms`
    (talkgate never holds text back to fill a buffer), `use_normalized_timestamps` (no text normalization here: the
    normalized text is the transcript), `add_phoneme_timestamps` (refused: no phonemizer)."""
    out: dict = {}
    named = field_of(msg, "speed", str, None, cid)
    if named is not None:
        if named not in SPEEDS:
            raise SessionError("invalid_request", f"speed {show(named)} must be slow, normal or fast", cid)
        out["speed"] = SPEEDS[named]
    config = field_of(msg, "generation_config", dict, {}, cid)
    try:
        speed = number(config, "speed", 0.6, 1.5, context_id=cid, code="invalid_generation_config")
        volume = number(config, "volume", 0.5, 2.0, context_id=cid, code="invalid_generation_config")
        emotion = field_of(config, "emotion", str, None, cid)
    except SessionError as e:
        raise SessionError("invalid_generation_config", f"generation_config: {e.message}", cid) from None
    if speed is not None:
        out["speed"] = speed
    if volume is not None:
        out["volume"] = volume
    if emotion is not None and (phrase := emotion_phrase(emotion, cid)) is not None:
        out["expression"] = (phrase,)
    integer(msg, "max_buffer_delay_ms", 0, MAX_BUFFER_DELAY_MS, context_id=cid, code="invalid_request")
    field_of(msg, "use_normalized_timestamps", bool, False, cid)
    if field_of(msg, "add_phoneme_timestamps", bool, False, cid):
        raise SessionError("phoneme_timestamps_unsupported", "add_phoneme_timestamps is not supported: this server "
                           "has no phonemizer (word timestamps: add_timestamps)", cid)
    return out


def context_config(msg: dict, cid: str | None, models: Models, voices: VoiceMap,
                   containers: tuple[str, ...] = ("raw",)) -> dict:
    """The context settings of a generation request (model, voice, format, language, `controls`), as ContextConfig
    fields. `model_id`: a served model's name, or Cartesia's (sonic-2, ...: the default's alias)."""
    model = field_of(msg, "model_id", str, None, cid)
    info = models.info_for(model, cid)
    try:
        name = voices.resolve("cartesia", voice_id(msg.get("voice"), cid), info.voices)
    except UnknownVoice as e:
        raise SessionError("voice_not_found", str(e), cid) from None
    fmt = parse_output_format(msg.get("output_format"), cid, containers)
    language = resolve_language(field_of(msg, "language", str, None, cid), info.languages)
    return {"voice": name, "format": fmt, "language": language, "model": model, **controls(msg, cid)}


class CartesiaProtocol(UtteranceProtocol):
    def __init__(self, session: Session, session_id: str, voices: VoiceMap):
        super().__init__(session, session_id)
        self.voices = voices
        self.timestamps: dict[str, bool] = {}       # context -> add_timestamps
        self.flush_ids: dict[str, int] = {}         # context -> flushes so far

    def ready(self) -> list:
        return []

    def idle_timeout(self) -> list:
        """Idle for the server's idle timeout: close (Cartesia closes idle sockets too; clients reconnect)."""
        self.utterances.close()
        return [Close(1000, "idle timeout")]

    def abort(self, code: str, message: str, ws_code: int) -> list:
        self.utterances.close()
        return [self._error(None, code, message), Close(ws_code, code)]

    def receive_binary(self, data: bytes) -> list:
        return [self._error(None, "invalid_message", "binary frames are not accepted: send JSON text messages")]

    def receive_text(self, data: str) -> list:
        cid = None
        try:
            msg = self._parse(data)
            cid = msg.get("context_id") if isinstance(msg.get("context_id"), str) else None
            if cid is None or not cid:
                raise SessionError("invalid_message", "context_id (a non-empty string) is required")
            if field_of(msg, "cancel", bool, False, cid):
                return self._cancel(cid)
            return self._generate(cid, msg)
        except SessionError as e:
            # an error is `done: true`: a context it names is over, so nothing of it may follow
            stop = self._cancel(cid) if cid is not None else []
            return stop + [self._error(cid, e.code, e.message)]

    def _cancel(self, cid: str) -> list:
        if cid not in self.utterances:
            return []       # already done (or never started): nothing follows either way
        self.timestamps.pop(cid, None)
        self.flush_ids.pop(cid, None)
        return self._wire(self.utterances.cancel(cid)) + self._purges(cid)

    def _generate(self, cid: str, msg: dict) -> list:
        transcript = field_of(msg, "transcript", str, "", cid)
        cont = field_of(msg, "continue", bool, False, cid)
        flush = field_of(msg, "flush", bool, False, cid)
        add_timestamps = field_of(msg, "add_timestamps", bool, False, cid)
        if cid not in self.utterances:
            self.utterances.open(cid, **context_config(msg, cid, self.session.models, self.voices))
            self.timestamps[cid] = add_timestamps
            self.flush_ids[cid] = 0
        events: list[Event] = []
        if transcript:
            events += self.utterances.append(cid, transcript)
        if cid in self.utterances and flush:
            self.flush_ids[cid] += 1
            events += self.utterances.flush(cid, tag=self.flush_ids[cid])
        if cid in self.utterances and not cont:
            events += self.utterances.end(cid)
        return self._wire(events)

    # ----- utterance events -> wire -----
    def _wire(self, events: list[Event]) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, Audio):
                out.append(self._audio_send(dumps(
                    {"type": "chunk", "data": base64.b64encode(ev.out.payload).decode(), "done": False,
                     "status_code": STATUS, "step_time": ev.out.duration_ms, "context_id": ev.key}),
                    ev.key, ev.out.stream, ev.out.duration_ms))
                out += self._words(ev.key, ev.words)
            elif isinstance(ev, SegmentDone):
                out += self._words(ev.key, ev.words)
                if ev.tag is not None:
                    out.append(send_json({"type": "flush_done", "done": False, "flush_done": True, "flush_id": ev.tag,
                                      "status_code": STATUS, "context_id": ev.key}))
            elif isinstance(ev, UtteranceDone):
                self.timestamps.pop(ev.key, None)
                self.flush_ids.pop(ev.key, None)
                out.append(send_json({"type": "done", "done": True, "status_code": STATUS, "context_id": ev.key}))
            elif isinstance(ev, ContextCancelled):
                out += self._purges(ev.context_id, ev.stream)
            elif isinstance(ev, ContextError):
                out += self._purges(ev.context_id, ev.stream)
                self.timestamps.pop(ev.context_id, None)
                self.flush_ids.pop(ev.context_id, None)
                out.append(self._error(ev.context_id, ev.code, ev.message))
        return out

    def _words(self, cid: str, words) -> list:
        if not words or not self.timestamps.get(cid):
            return []
        return [send_json({"type": "timestamps", "done": False, "status_code": STATUS, "context_id": cid,
                       "word_timestamps": {"words": [w.text for w in words], "start": [w.start_s for w in words],
                                           "end": [w.end_s for w in words]}})]

    def _error(self, cid: str | None, code: str, message: str) -> Send:
        """Cartesia's error message; its status_code is 500 only for the server's own failures."""
        status = 429 if code == BUSY else http_status(code)
        return send_json({"type": "error", "done": True, "title": code.replace("_", " ").capitalize(),
                          "message": message, "error_code": code, "status_code": status, "context_id": cid},
                         error=code)


# ----- HTTP: POST /tts/bytes (the audio as the body) and POST /tts/sse (the WebSocket's messages as events) -----
HTTP_CONTAINERS = ("raw", "wav", "mp3")


def parse_http_request(body: object, models: Models, voices: VoiceMap, max_chars: int, events: bool) -> tuple[str, dict, dict]:
    """-> (transcript, ContextConfig fields, the request's own fields for /tts/sse: context_id,
    add_timestamps); raises SessionError."""
    if not isinstance(body, dict):
        raise SessionError("invalid_request", "the body must be a JSON object")
    text = field_of(body, "transcript", str, required=True)
    if not text.strip():
        raise SessionError("invalid_request", "transcript is empty")
    if len(text) > max_chars:
        raise SessionError("text_too_long", f"transcript is limited to {max_chars} characters")
    own = {"context_id": field_of(body, "context_id", str) if events else None,
           "add_timestamps": field_of(body, "add_timestamps", bool, False) if events else False}
    return text, context_config(body, None, models, voices, HTTP_CONTAINERS), own


def error_fields(code: str, message: str, request_id: str | None, context_id: str | None = None) -> dict:
    """Cartesia's error (its SSE `error` event, and an HTTP error's body); status_code 500 only for the
    server's own failures."""
    return {"type": "error", "done": True, "title": code.replace("_", " ").capitalize(), "message": message,
            "error_code": code, "status_code": 429 if code == BUSY else http_status(code), "request_id": request_id,
            "context_id": context_id}


def http_error(status: int, code: str, message: str, request_id: str | None = None,
               context_id: str | None = None) -> Respond:
    """An HTTP error (a request refused before its translator is made gets a request id of its own)."""
    body = {**error_fields(code, message, request_id or new_request_id(), context_id), "status_code": status}
    return Respond(status, "application/json", dumps(body).encode(), error=code)


class CartesiaSpeech(HttpSpeech):
    """/tts/bytes: the audio, streamed as the body. /tts/sse (`events`): the WebSocket's `chunk`,
    `timestamps` (with add_timestamps: estimated) and `done` messages as server-sent events."""

    def __init__(self, session: Session, text: str, fmt: AudioFormat, events: bool, context_id: str | None = None,
                 add_timestamps: bool = False):
        super().__init__(session, text, streamed=True)
        self.events, self.context_id, self.add_timestamps = events, context_id, add_timestamps
        self.content_type = "text/event-stream" if events else CODECS[fmt.encoding][1]
        self.timeline = Timeline(speed=session.defaults.speed)
        self.timeline.add_text(text)

    def body(self, ev: AudioOut) -> list[bytes]:
        if not self.events:
            return [ev.payload]
        out = [sse({"type": "chunk", "data": base64.b64encode(ev.payload).decode(), "done": False,
                    "status_code": STATUS, "step_time": ev.duration_ms, "context_id": self.context_id}, "chunk")]
        _, words = self.timeline.audio(ev.duration_ms)
        return out + self._words(words)

    def end(self, ev: ContextFinished) -> list[bytes]:
        if not self.events:
            return []
        _, words = self.timeline.end_segment()
        return self._words(words) + [sse({"type": "done", "done": True, "status_code": 200,
                                          "context_id": self.context_id}, "done")]

    def failed_body(self, code: str, message: str) -> bytes | None:
        if not self.events:
            return None
        return sse(error_fields(code, message, self.request_id, self.context_id), "error")

    def error(self, status: int, code: str, message: str) -> Respond:
        return http_error(status, code, message, self.request_id, self.context_id)

    def _words(self, words) -> list[bytes]:
        if not words or not self.add_timestamps:
            return []
        return [sse({"type": "timestamps", "done": False, "status_code": STATUS, "context_id": self.context_id,
                     "word_timestamps": {"words": [w.text for w in words], "start": [w.start_s for w in words],
                                         "end": [w.end_s for w in words]}}, "timestamps")]
