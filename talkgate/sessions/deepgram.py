"""Deepgram TTS, Sans-I/O, onto `Session`: the streaming WebSocket (`/v1/speak`) and the REST endpoint
(`POST /v1/speak`: sessions/http.py). Flux TTS (`/v2/speak`) is sessions/deepgram_v2.py, with the helpers here.

One stream of text per socket, spoken as one utterance (sessions/utterances.py): `Speak` appends
text, `Flush` speaks what came so far and is answered with `Flushed` (its sequence_id) once that
audio is out, `Clear` stops everything at once and is answered with `Cleared` AFTER the queued audio
was purged (clients credit binary frames to the current turn, so none of the old turn may follow
`Cleared`), `Close` speaks the rest and closes with 1000. Audio goes out as binary frames of raw
samples. Client mistakes are answered the Deepgram way: a close frame whose reason says what was wrong.
"""
from __future__ import annotations

import re

from talkgate.codecs import ENCODINGS as CODECS
from talkgate.sessions.actions import Close, close_code, dumps, send_json
from talkgate.sessions.fields import SessionError, field_of, query_int, show
from talkgate.sessions.http import HttpSpeech, Respond, new_request_id
from talkgate.sessions.models import Models
from talkgate.sessions.session import AudioFormat, ContextCancelled, ContextConfig, ContextError, Session
from talkgate.sessions.utterances import Audio, Event, SegmentDone, UtteranceDone, UtteranceProtocol
from talkgate.sessions.voices import UnknownVoice, VoiceMap

ENCODINGS = {"linear16": "pcm_s16le", "mulaw": "mulaw", "alaw": "alaw"}
RATES = {"linear16": (8000, 16000, 24000, 32000, 48000), "mulaw": (8000,), "alaw": (8000,)}
DEFAULT_MODEL = "aura-2-thalia-en"
STREAM = "speak"
MAX_SPEAK_CHARS = 2000      # Deepgram's limit on the text of one Speak message
SPEED = (0.7, 1.5)          # Aura-2's `speed` on /v1/speak (WebSocket and REST)
DECIMAL = re.compile(r"-?[0-9]{1,4}(\.[0-9]{1,8})?\Z")


def speed_fault(speed: float, lo: float, hi: float, step: float | None = None) -> tuple[str, str] | None:
    """Deepgram's error code and description for a speed it refuses, else None."""
    if not lo <= speed <= hi:
        return "SPEED_OUT_OF_RANGE", f"speed {speed:g} is outside {lo:g} to {hi:g}"
    if step is not None and abs(speed / step - round(speed / step)) > 1e-6:
        return "SPEED_INCREMENT_INVALID", f"speed {speed:g} is not a multiple of {step:g}"
    return None


def query_speed(query: dict[str, str], lo: float, hi: float, step: float | None = None) -> float | None:
    """The query's `speed` (None: not given): a decimal number in [lo, hi] (a multiple of `step`); raises
    SessionError with Deepgram's code. Applied as the pitch-kept tempo."""
    if "speed" not in query:
        return None
    if not DECIMAL.match(query["speed"]):
        raise SessionError("SPEED_OUT_OF_RANGE", f"speed {show(query['speed'])} is not a number from {lo:g} to {hi:g}")
    speed = float(query["speed"])
    fault = speed_fault(speed, lo, hi, step)
    if fault is not None:
        raise SessionError(*fault)
    return speed


def stream_format(query: dict[str, str], rates: dict[str, tuple[int, ...]]) -> AudioFormat:
    """The raw audio of a streaming socket (/v1/speak, /v2/speak): `encoding` and `sample_rate`, one of `rates`
    (encoding -> its sample rates); raises SessionError (Deepgram's codes)."""
    enc = query.get("encoding", "linear16")
    if enc not in rates:
        raise SessionError("UNSUPPORTED_ENCODING", f"encoding {show(enc)} is not supported: use "
                           f"{', '.join(rates)}")
    rate = query.get("sample_rate", "24000" if enc == "linear16" else "8000")
    if query_int(rate, 1, 1_000_000) not in rates[enc]:
        raise SessionError("UNSUPPORTED_SAMPLE_RATE", f"sample_rate {show(rate)} is not supported for {enc}: use "
                           f"{', '.join(map(str, rates[enc]))}")
    return AudioFormat(ENCODINGS[enc], int(rate))


def parse_query(query: dict[str, str]) -> AudioFormat:
    fmt = stream_format(query, RATES)
    if query.get("container", "none") not in ("none", "raw"):
        raise SessionError("UNSUPPORTED_CONTAINER", "the WebSocket sends raw audio: container must be none")
    return fmt


def model_voice(voices: VoiceMap, model: str, model_voices: tuple[str, ...]) -> str | None:
    """A Deepgram model name -> the talkgate voice it maps to (sessions/voices.py VoiceMap); raises SessionError
    INVALID_MODEL."""
    try:
        return voices.resolve("deepgram", model, model_voices)
    except UnknownVoice as e:
        raise SessionError("INVALID_MODEL", str(e)) from None


def served_model(model: str, models: Models, voices: VoiceMap) -> tuple[str | None, str | None]:
    """Deepgram's `model` -> (the served model it names, None: the one its voice has; the talkgate voice). Deepgram's
    model is a voice (aura-2-thalia-en), so a served model is named before it, `NAME:aura-2-thalia-en`: the
    separator is in no served model's name (sessions/models.py MODEL_NAME) nor Deepgram's, and any client sends it
    unmodified as its model. Raises SessionError INVALID_MODEL (Deepgram's code for every model it does not serve)."""
    name, separator, voice_model = model.partition(":")
    if not separator:
        name, voice_model = None, model
    try:
        info = models.info_for(name)
    except SessionError as e:
        raise SessionError("INVALID_MODEL", e.message) from None
    return name, model_voice(voices, voice_model, info.voices)


def speak_text(msg: dict) -> str:
    """The text of a `Speak` (the same message on /v1/speak and /v2/speak); raises SessionError."""
    text = field_of(msg, "text", str)
    if text is None:
        raise SessionError("invalid_message", "Speak needs text (a string)")
    if len(text) > MAX_SPEAK_CHARS:
        raise SessionError("text_too_long", f"the text of one Speak is limited to {MAX_SPEAK_CHARS} characters")
    return text


class DeepgramProtocol(UtteranceProtocol):
    def __init__(self, session: Session, session_id: str, query: dict[str, str], voices: VoiceMap):
        super().__init__(session, session_id)
        self.model = query.get("model", DEFAULT_MODEL)
        self.flushes = 0            # sequence_id of the next Flush
        self.clears = 0
        self.closing = False
        self.startup_error: SessionError | None = None
        try:
            served, voice = served_model(self.model, session.models, voices)
            self.session.configure(voice=voice, format=parse_query(query), model=served,
                                   speed=query_speed(query, *SPEED) or 1.0)
        except SessionError as e:
            self.startup_error = e

    def ready(self) -> list:
        if self.startup_error is not None:
            return [self._close(self.startup_error.code, self.startup_error.message)]
        return [send_json({"type": "Metadata", "request_id": self.session_id, "model_name": self.model,
                       "model_version": "talkgate", "model_uuid": self.session_id})]

    def idle_timeout(self) -> list:
        self.utterances.close()
        return [Close(1000, "NET-0001: no messages received within the idle timeout")]

    def abort(self, code: str, message: str, ws_code: int) -> list:
        self.utterances.close()
        return [self._close(code, message, ws_code)]

    def receive_binary(self, data: bytes) -> list:
        return [self._close("DATA-0000", "binary messages are not accepted: send JSON text messages", 1003)]

    def receive_text(self, data: str) -> list:
        try:
            msg = self._parse(data)
            kind = msg.get("type")
            if kind == "Speak":
                return self._speak(msg)
            if kind == "Flush":
                if STREAM not in self.utterances:
                    self.utterances.open(STREAM)
                self.flushes += 1
                return self._wire(self.utterances.flush(STREAM, tag=self.flushes - 1))
            if kind == "Clear":
                return self._clear()
            if kind == "Close":
                self.closing = True
                if STREAM in self.utterances:
                    return self._wire(self.utterances.end(STREAM))
                return [Close(1000, "closed by client")]
            return [send_json({"type": "Warning", "description": f"unknown message type {show(kind)}: expected Speak, "
                               "Flush, Clear or Close", "code": "UNKNOWN_MESSAGE_TYPE"}, error="unknown_type")]
        except SessionError as e:
            return [self._close("DATA-0000", e.message, 1008, e.code)]

    def _speak(self, msg: dict) -> list:
        text = speak_text(msg)
        if self.closing:
            return [send_json({"type": "Warning", "description": "Speak after Close is ignored", "code": "CLOSING"})]
        return self._wire(self.utterances.append(STREAM, text))

    def _clear(self) -> list:
        self.clears += 1
        # audio of flushed segments may still be queued too: none of the old turn may follow Cleared
        out = self._barge_in(STREAM)
        out.append(send_json({"type": "Cleared", "sequence_id": self.clears - 1}))
        return out + [Close(1000, "closed by client")] if self.closing else out

    # ----- utterance events -> wire -----
    def _wire(self, events: list[Event]) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, Audio):
                out.append(self._audio_send(ev.out.payload, ev.key, ev.out.stream, ev.out.duration_ms))
            elif isinstance(ev, SegmentDone):
                if ev.tag is not None:
                    out.append(send_json({"type": "Flushed", "sequence_id": ev.tag}))
            elif isinstance(ev, UtteranceDone):
                out.append(Close(1000, "closed by client"))
            elif isinstance(ev, ContextCancelled):
                out += self._purges(None, ev.stream)
            elif isinstance(ev, ContextError):
                out += self._purges(None, ev.stream)
                out.append(self._close(ev.code, ev.message))
        return out

    @staticmethod
    def _close(reason_code: str, message: str, code: int | None = None, error: str | None = None) -> Close:
        """Deepgram reports errors as a close frame: its reason starts with the error's code."""
        error = error or reason_code
        return Close(code or close_code(error), f"{reason_code}: {message}", error=error)




# ----- REST: POST /v1/speak?model=&encoding=&sample_rate=&container=&bit_rate= with {"text": ...} -----
# encoding -> (session encoding, sample rates (the first is the default), containers (the first is the
# default), bit rates: None (the codec's), a tuple of choices or an inclusive range, and its default)
REST_FORMATS = {
    "mp3": ("mp3", (22050,), ("none",), (32000, 48000), 48000),
    "linear16": ("pcm_s16le", (24000, 8000, 16000, 32000, 48000), ("wav", "none"), None, None),
    "mulaw": ("mulaw", (8000,), ("none",), None, None),
    "alaw": ("alaw", (8000,), ("none",), None, None),
    "flac": ("flac", (48000, 8000, 16000, 22050, 24000, 32000), ("none",), None, None),
    "opus": ("ogg_opus", (48000,), ("ogg",), range(4000, 512001), 12000),
    "aac": ("aac", (22050,), ("none",), range(4000, 192001), 48000),
}
MAX_REST_CHARS = 2000       # Deepgram's limit on the text of one request


def parse_rest_query(query: dict[str, str]) -> AudioFormat:
    """The REST query's format; raises SessionError (Deepgram's codes)."""
    enc = query.get("encoding", "mp3")
    if enc not in REST_FORMATS:
        raise SessionError("UNSUPPORTED_ENCODING", f"encoding {show(enc)} is not supported: use "
                           f"{', '.join(REST_FORMATS)}")
    session_enc, rates, containers, bitrates, default_bitrate = REST_FORMATS[enc]
    rate = query_int(query.get("sample_rate", str(rates[0])), 1, 1_000_000)
    if rate not in rates:
        raise SessionError("UNSUPPORTED_SAMPLE_RATE", f"sample_rate {show(query.get('sample_rate'))} is not "
                           f"supported for {enc}: use {', '.join(map(str, sorted(rates)))}")
    container = query.get("container", containers[0])
    if container not in containers:
        raise SessionError("UNSUPPORTED_CONTAINER", f"container {show(container)} is not supported for {enc}: use "
                           f"{' or '.join(containers)}")
    bitrate = None
    if "bit_rate" in query:
        bitrate = query_int(query["bit_rate"], 1, 10_000_000)
        if bitrates is None or bitrate not in bitrates:
            choices = ("not configurable" if bitrates is None else f"{bitrates.start} to {bitrates.stop - 1}"
                       if isinstance(bitrates, range) else ", ".join(map(str, bitrates)))
            raise SessionError("UNSUPPORTED_BIT_RATE", f"bit_rate {show(query['bit_rate'])} for {enc}: {choices}")
    elif bitrates is not None:
        bitrate = default_bitrate
    return AudioFormat("wav" if container == "wav" else session_enc, rate, bitrate=bitrate)


def parse_rest_request(query: dict[str, str], body: object, models: Models,
                       voices: VoiceMap) -> tuple[str, str, ContextConfig]:
    """-> (text, Deepgram's model name, the context's config); raises SessionError."""
    if not isinstance(body, dict):
        raise SessionError("INVALID_REQUEST", "the body must be a JSON object {\"text\": ...}")
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise SessionError("INVALID_REQUEST", "text (a non-empty string) is required")
    if len(text) > MAX_REST_CHARS:
        raise SessionError("INVALID_REQUEST", f"text is limited to {MAX_REST_CHARS} characters")
    model = query.get("model", DEFAULT_MODEL)
    served, voice = served_model(model, models, voices)
    return text, model, ContextConfig(voice=voice, format=parse_rest_query(query), model=served,
                                      speed=query_speed(query, *SPEED) or 1.0)


def rest_error(status: int, code: str, message: str, request_id: str | None = None) -> Respond:
    """Deepgram's REST error: {"err_code", "err_msg", "request_id"} (a request refused before its translator is made
    gets a request id of its own: Deepgram's errors always name one)."""
    return Respond(status, "application/json", dumps({"err_code": code, "err_msg": message,
                                                      "request_id": request_id or new_request_id()}).encode(),
                   error=code)


class DeepgramSpeech(HttpSpeech):
    """The audio as the body, streamed as it is generated."""

    def __init__(self, session: Session, text: str, model: str, fmt: AudioFormat):
        super().__init__(session, text, streamed=True)
        self.model = model
        self.content_type = CODECS[fmt.encoding][1]

    def headers(self) -> tuple[tuple[str, str], ...]:
        return (("dg-request-id", self.request_id), ("dg-model-name", self.model), ("dg-char-count", str(len(self.text))))

    def error(self, status: int, code: str, message: str) -> Respond:
        return rest_error(status, code, message, self.request_id)
