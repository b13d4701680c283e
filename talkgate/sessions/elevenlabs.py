"""ElevenLabs TTS, Sans-I/O, onto `Session`: the WebSockets (`stream-input`, `multi-stream-input`) and the
HTTP text-to-speech endpoints (convert, stream, with timestamps: sessions/http.py).

Wire facts: docs/compat.md. One ElevenLabs context is one utterance (sessions/utterances.py): a
`flush` speaks the text so far and more text may follow in the same context. `close_context` after
the last flush lets the audio finish and then answers `isFinal` (pipecat and LiveKit end every turn
that way); `close_context` with text not yet flushed is a barge-in: the context stops at once
(queued audio purged) and gets its `isFinal`. Alignment is an estimate (sessions/alignment.py).
"""
from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from talkgate.codecs import ENCODINGS, FormatError, make_stream_encoder
from talkgate.codecs.tempo import MAX_SPEED, MIN_SPEED
from talkgate.sessions.actions import Close, Send, close_code, dumps, send_json
from talkgate.sessions.alignment import Timeline
from talkgate.sessions.expression import style_phrase
from talkgate.sessions.fields import SessionError, field_of, integer, number, query_int, show
from talkgate.sessions.http import HttpSpeech, Respond
from talkgate.sessions.models import Models
from talkgate.sessions.session import (
    AudioFormat, AudioOut, ContextCancelled, ContextConfig, ContextError, ContextFinished, Session,
)
from talkgate.sessions.ssml import Pause, SsmlError, SsmlReader
from talkgate.sessions.utterances import (
    Audio, Event, SegmentDone, UtteranceDone, UtteranceProtocol,
)
from talkgate.sessions.voices import UnknownVoice, VoiceMap, VoiceScope, resolve_language
from talkgate.synth.api import SamplingParams

MAX_CONTEXTS = 5                # ElevenLabs' limit of simultaneous contexts per socket
DEFAULT_INACTIVITY_S = 20
MAX_INACTIVITY_S = 180
SINGLE = ""                     # the one context of a stream-input socket
PCM_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)
MP3_FORMATS = {(22050, 32), (24000, 48), (44100, 32), (44100, 64), (44100, 96), (44100, 128), (44100, 192)}
OPUS_KBPS = (32, 64, 96, 128, 192)
# compressed formats are encoded here, per context, from the session's engine-rate float PCM
ENGINE_PCM = AudioFormat("pcm_f32le", 24000)


@dataclass(frozen=True)
class OutputFormat:
    session: AudioFormat                # what the session produces
    container: str | None = None        # "mp3" / "ogg_opus": encoded from it here
    rate: int = 0
    bitrate: int = 0


def parse_output_format(name: str) -> OutputFormat:
    """ElevenLabs `output_format` -> what to produce; raises SessionError."""
    m = re.fullmatch(r"(pcm|ulaw|alaw|mp3|opus)_(\d+)(?:_(\d+))?", name)
    kind, rate, kbps = (m.group(1), int(m.group(2)), m.group(3) and int(m.group(3))) if m else (None, 0, None)
    if kind == "pcm" and rate in PCM_RATES and kbps is None:
        return OutputFormat(AudioFormat("pcm_s16le", rate))
    if kind in ("ulaw", "alaw") and rate == 8000 and kbps is None:
        return OutputFormat(AudioFormat("mulaw" if kind == "ulaw" else "alaw", 8000))
    if kind == "mp3" and (rate, kbps) in MP3_FORMATS:
        return OutputFormat(ENGINE_PCM, "mp3", rate, kbps * 1000)
    if kind == "opus" and rate == 48000 and kbps in OPUS_KBPS:    # Ogg Opus, as ElevenLabs sends it
        return OutputFormat(ENGINE_PCM, "ogg_opus", rate, kbps * 1000)
    raise SessionError("invalid_output_format", f"invalid output_format {show(name)}: expected pcm_8000, pcm_16000, "
                       "pcm_22050, pcm_24000, pcm_32000, pcm_44100, pcm_48000, ulaw_8000, alaw_8000, "
                       "mp3_22050_32, mp3_24000_48, mp3_44100_32/64/96/128/192 or opus_48000_32/64/96/128/192")




SPEED_RANGE = (0.7, 1.2)        # voice_settings.speed, as ElevenLabs takes it
QUERY_FLAGS = ("sync_alignment", "auto_mode", "enable_ssml_parsing", "enable_logging")
NORMALIZATION = ("auto", "on", "off")
CHUNK_LENGTHS = (50, 500)       # generation_config.chunk_length_schedule: each entry, ElevenLabs' range


def voice_settings(msg: dict, cid: str | None = None) -> dict:
    """`voice_settings` as ContextConfig fields: `speed` (0.7 to 1.2) is the pitch-kept tempo, `style` (0 to 1) an
    instruction phrase (sessions/expression.py); `stability`, `similarity_boost` (0 to 1) and `use_speaker_boost`
    are checked and have no counterpart in the model (docs/compat.md). Raises SessionError invalid_voice_settings."""
    settings = field_of(msg, "voice_settings", dict, {}, cid)
    try:
        for name in ("stability", "similarity_boost"):
            number(settings, name, 0.0, 1.0, context_id=cid)
        field_of(settings, "use_speaker_boost", bool, None, cid)
        speed = number(settings, "speed", *SPEED_RANGE, context_id=cid)
        style = number(settings, "style", 0.0, 1.0, context_id=cid)
    except SessionError as e:
        raise SessionError("invalid_voice_settings", f"voice_settings: {e.message}", cid) from None
    out: dict = {} if speed is None else {"speed": speed}
    if style is not None and (phrase := style_phrase(style)) is not None:
        out["expression"] = (phrase,)
    return out


def generation_config(msg: dict, cid: str | None = None) -> None:
    """`generation_config.chunk_length_schedule` checked (a list of integers from 50 to 500). ElevenLabs waits for
    that much text before it generates; talkgate generates from the first word the tokenizer commits, which is never
    later, so the schedule is met as it stands (docs/compat.md)."""
    config = field_of(msg, "generation_config", dict, {}, cid)
    schedule = config.get("chunk_length_schedule")
    if schedule is not None and (not isinstance(schedule, list) or not schedule or not all(
            isinstance(n, int) and not isinstance(n, bool) and CHUNK_LENGTHS[0] <= n <= CHUNK_LENGTHS[1]
            for n in schedule)):
        raise SessionError("invalid_generation_config", "generation_config.chunk_length_schedule must be a list of "
                           f"integers from {CHUNK_LENGTHS[0]} to {CHUNK_LENGTHS[1]}", cid)


def normalization(value: str | None) -> None:
    """`apply_text_normalization`: auto, on or off. The model reads numbers and symbols itself (its own
    normalization, always on): checked, nothing to switch."""
    if value is not None and value not in NORMALIZATION:
        raise SessionError("invalid_request", f"apply_text_normalization {show(value)} must be auto, on or off")


class ElevenLabsProtocol(UtteranceProtocol):
    def __init__(self, session: Session, session_id: str, voice_id: str, query: dict[str, str],
                 voices: VoiceMap, multi: bool, authenticate: Callable[[str], VoiceScope | None] | None = None):
        """`query`: the socket URL's query parameters; `authenticate`: when set, the first message must
        carry a valid `xi_api_key`, and the voice is looked up among the voices it gives then (not before:
        until then the client is nobody)."""
        super().__init__(session, session_id)
        self.multi, self.authenticate = multi, authenticate
        self.idle_timeout_s = float(DEFAULT_INACTIVITY_S)
        self.closing = False            # stream-input: input over, close once the audio is out
        self.output = OutputFormat(AudioFormat())
        self.encoders: dict[str, tuple] = {}    # context -> (mp3 / Ogg Opus encoder, its last stream)
        self.startup_error: SessionError | None = None
        self.ssml: dict[str, tuple[SsmlReader, float]] | None = None    # enable_ssml_parsing: context -> its
                                                                         # reader and its own speed
        self.voice_id, self.query = voice_id, query
        if authenticate is None:
            self._start(voices)

    def _start(self, voices: VoiceMap) -> None:
        try:
            self._configure(self.voice_id, self.query, voices)
        except SessionError as e:
            self.startup_error = e

    def _configure(self, voice_id: str, query: dict[str, str], voices: VoiceMap) -> None:
        model = query.get("model_id")       # a served model's name, or ElevenLabs' (the default's alias)
        info = self.session.models.info_for(model)
        try:
            voice = voices.resolve("elevenlabs", voice_id, info.voices)
        except UnknownVoice as e:
            raise SessionError("voice_not_found", str(e)) from None
        name = query.get("output_format", "mp3_44100_128")
        self.output = parse_output_format(name)
        if self.output.container is not None:
            try:    # the codec library may lack it (e.g. libopus not installed)
                make_stream_encoder(self.output.container, self.output.rate, bitrate=self.output.bitrate)
            except FormatError as e:
                raise SessionError("unsupported_output_format", f"output_format {show(name)} is not available "
                                   f"on this server: {e}") from None
        timeout = query_int(query.get("inactivity_timeout", str(DEFAULT_INACTIVITY_S)), 1, MAX_INACTIVITY_S)
        if timeout is None:
            raise SessionError("invalid_inactivity_timeout",
                               f"inactivity_timeout must be an integer from 1 to {MAX_INACTIVITY_S} seconds")
        self.idle_timeout_s = float(timeout)
        for flag in QUERY_FLAGS:
            if query.get(flag, "false").lower() not in ("true", "false"):
                raise SessionError("invalid_request", f"{flag} must be true or false")
        normalization(query.get("apply_text_normalization"))
        self.ssml = {} if query.get("enable_ssml_parsing", "false").lower() == "true" else None
        seed = query.get("seed")
        if seed is not None and (seed := query_int(seed, 0, (1 << 64) - 1)) is None:
            raise SessionError("invalid_seed", "seed must be an integer from 0 to 2^64 - 1")
        self.session.configure(voice=voice, format=self.output.session,
                               language=resolve_language(query.get("language_code"), info.languages),
                               sampling=SamplingParams(seed=seed), model=model)

    # ----- connection -----
    def ready(self) -> list:
        if self.startup_error is not None:
            return self._fatal(self.startup_error.code, self.startup_error.message)
        return []

    def idle_timeout(self) -> list:
        self.utterances.close()
        return self._fatal("input_timeout_exceeded", f"Have not received new text for {self.idle_timeout_s:g} "
                           "seconds: closing")

    def abort(self, code: str, message: str, ws_code: int) -> list:
        self.utterances.close()
        return [self._error(code, message), Close(ws_code, code)]

    # ----- client frames -----
    def receive_binary(self, data: bytes) -> list:
        if self.authenticate is not None:
            return self._unauthorized()
        return [self._error("invalid_message", "binary frames are not accepted: send JSON text messages")]

    def receive_text(self, data: str) -> list:
        try:
            msg = self._parse(data)
            if self.authenticate is not None:
                key = msg.get("xi_api_key")
                scope = self.authenticate(key) if isinstance(key, str) else None
                if scope is None:
                    return self._unauthorized()
                self.authenticate = None
                self.session.voices = scope.voices
                self._start(scope.voice_map)
                if self.startup_error is not None:
                    return self.ready()
            return self._on_multi(msg) if self.multi else self._on_single(msg)
        except SessionError as e:
            if self.authenticate is not None:
                return self._unauthorized()
            return [self._error(e.code, e.message, e.context_id if self.multi else None)]

    def _unauthorized(self) -> list:
        return self._fatal("invalid_api_key", "a valid API key is required (xi-api-key header, authorization "
                           "query parameter or xi_api_key in the first message)")

    def _on_multi(self, msg: dict) -> list:
        if msg.get("close_socket") is True:
            self.closing = True
            return self._wire(self.utterances.cancel_all()) + [Close(1000, "close_socket")]
        cid = field_of(msg, "context_id", str)
        text = field_of(msg, "text", str, context_id=cid)
        flush = field_of(msg, "flush", bool, False, cid)
        if cid is None:
            if text == "" and not flush and msg.get("close_context") is None:
                return []           # a bare keepalive
            raise SessionError("invalid_message", "context_id is required on multi-stream-input")
        if field_of(msg, "close_context", bool, False, cid):
            return self._close_context(cid)
        if text is None and not flush:
            raise SessionError("invalid_message", "a message needs text, flush, close_context or close_socket", cid)
        return self._input(cid, text, flush, msg)

    def _on_single(self, msg: dict) -> list:
        text = field_of(msg, "text", str)
        flush = field_of(msg, "flush", bool, False)
        if text is None and not flush:
            raise SessionError("invalid_message", "a message needs text (\"\" ends the input) or flush")
        if text == "" and not flush:
            self.closing = True
            return self._ssml_end(SINGLE) + self._wire(self.utterances.end(SINGLE))
        return self._input(SINGLE, text, flush, msg)

    def _input(self, cid: str, text: str | None, flush: bool, msg: dict) -> list:
        settings = voice_settings(msg, cid)      # a context's own from its opening message on
        generation_config(msg, cid)
        field_of(msg, "try_trigger_generation", bool, context_id=cid)     # the model starts as early as it can anyway
        events: list[Event] = []
        if cid not in self.utterances:
            if text == "" and not flush:
                return []           # keepalive of a context that is over or not yet opened
            # contexts the client closed (close_context) no longer count, even while their audio finishes
            if sum(not u.ended for u in self.utterances.by_key.values()) >= MAX_CONTEXTS:
                return self._fatal("max_active_conversations", f"Maximum simultaneous contexts ({MAX_CONTEXTS}) "
                                   "exceeded: close a context before opening another")
            self.utterances.open(cid, **settings)
            if self.ssml is not None:
                self.ssml[cid] = (SsmlReader(), settings.get("speed", self.session.defaults.speed))
            if text is not None and not text.strip():
                text = ""           # the opening " " only opens the context
        if text and self.ssml is not None and cid in self.ssml:
            events += self._ssml(cid, text)
        elif text:
            events += self.utterances.append(cid, text)
        if flush and cid in self.utterances:
            events += self.utterances.flush(cid)
        return self._wire(events)

    def _close_context(self, cid: str) -> list:
        utt = self.utterances.by_key.get(cid)
        if utt is None:
            return [self._final(cid)]       # already over: say so again, harmlessly
        if utt.open_chars:
            events = self.utterances.cancel(cid)     # barge-in: text not flushed
            return self._wire(events) + [self._final(cid)]
        return self._ssml_end(cid) + self._wire(self.utterances.end(cid))

    def _ssml(self, cid: str, text: str) -> list[Event]:
        """Text with SSML (sessions/ssml.py): its text appended, its breaks and rates at the boundaries they mark."""
        reader, speed = self.ssml[cid]
        try:
            items = reader.feed(text)
        except SsmlError as e:
            raise SessionError("invalid_ssml", f"{e}: the message's text from that tag on is not spoken", cid) from None
        events: list[Event] = []
        for item in items:
            if cid not in self.utterances:      # it failed meanwhile
                break
            if isinstance(item, str):
                events += self.utterances.append(cid, item)
            elif isinstance(item, Pause):
                events += self.utterances.boundary(cid, pause_ms=item.ms)
            else:
                rate = speed * item.factor
                if not MIN_SPEED <= rate <= MAX_SPEED:
                    raise SessionError("invalid_ssml", f"<prosody rate> makes the speed {rate:g}: talkgate's is "
                                       f"{MIN_SPEED:g} to {MAX_SPEED:g}", cid)
                events += self.utterances.boundary(cid, speed=rate)
        return events

    def _ssml_end(self, cid: str) -> list:
        """The end of a context's SSML: a tag left open is the client's mistake, said (the context still ends)."""
        entry = self.ssml.pop(cid, None) if self.ssml is not None else None
        try:
            if entry is not None:
                entry[0].finish()
        except SsmlError as e:
            return [self._error("invalid_ssml", str(e), cid if self.multi else None)]
        return []

    # ----- utterance events -> wire -----
    def _wire(self, events: list[Event]) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, Audio):
                out.append(self._audio(ev))
            elif isinstance(ev, SegmentDone):
                if ev.span is not None:     # characters the estimate had not placed yet
                    out.append(send_json(self._message(ev.key, None, ev.span)))
            elif isinstance(ev, UtteranceDone):
                self._ssml_end(ev.key)
                out += self._encoder_tail(ev.key)
                out.append(self._final(ev.key))
                if not self.multi:
                    out.append(Close(1000, "done"))
            elif isinstance(ev, ContextCancelled):
                self.encoders.pop(ev.context_id, None)
                self._ssml_end(ev.context_id)
                out += self._purges(ev.context_id, ev.stream)
            elif isinstance(ev, ContextError):
                self.encoders.pop(ev.context_id, None)
                if ev.fatal:
                    self._ssml_end(ev.context_id)
                out += self._purges(ev.context_id, ev.stream)
                out.append(self._error(ev.code, ev.message, ev.context_id if self.multi else None))
                if ev.fatal and ev.context_id is not None:
                    out.append(self._final(ev.context_id))
                    if not self.multi:
                        out.append(Close(close_code(ev.code), ev.code))
        return out

    def _audio(self, ev: Audio) -> Send:
        payload = ev.out.payload
        if self.output.container is not None:
            enc, _ = self.encoders.get(ev.key) or (make_stream_encoder(
                self.output.container, self.output.rate, bitrate=self.output.bitrate), None)
            self.encoders[ev.key] = (enc, ev.out.stream)
            payload = b"".join(packet.data for packet in enc.encode(np.frombuffer(payload, np.float32)))
        audio = base64.b64encode(payload).decode() if payload else None     # an encoder may hold a frame back
        return self._audio_send(dumps(self._message(ev.key, audio, ev.span)), ev.key, ev.out.stream,
                                ev.out.duration_ms)

    def _encoder_tail(self, key: str) -> list:
        """The end of a compressed stream (the encoder's last frames, the Ogg end page)."""
        if key not in self.encoders:
            return []
        enc, stream = self.encoders.pop(key)
        tail = b"".join(packet.data for packet in enc.flush())
        if not tail:
            return []
        return [self._audio_send(dumps(self._message(key, base64.b64encode(tail).decode(), None)), key, stream, 0.0)]

    def _message(self, key: str, audio: str | None, span) -> dict:
        alignment = span.as_elevenlabs() if span is not None else None
        msg = {"audio": audio, "isFinal": False, "alignment": alignment, "normalizedAlignment": alignment}
        if self.multi:
            msg["contextId"] = key
        return msg

    def _final(self, key: str) -> Send:
        return send_json({"isFinal": True, "contextId": key} if self.multi else {"isFinal": True})

    def _error(self, code: str, message: str, context_id: str | None = None) -> Send:
        msg = {"message": message, "error": code, "code": 1008}
        if context_id is not None:
            msg["contextId"] = context_id
        return send_json(msg, error=code)

    def _fatal(self, code: str, message: str) -> list:
        return [self._error(code, message), Close(1008, code)]


# ----- HTTP: POST /v1/text-to-speech/{voice_id}[/stream][/with-timestamps | /stream/with-timestamps] -----
MAX_SEED = (1 << 32) - 1           # ElevenLabs' seed range
LATENCY_LEVELS = range(5)         # optimize_streaming_latency 0..4: accepted, not applicable


def http_format(output: OutputFormat) -> AudioFormat:
    """The session's format of an HTTP response: compressed formats are the session's own encoding here
    (one request is one stream)."""
    if output.container is None:
        return output.session
    return AudioFormat(output.container, output.rate, bitrate=output.bitrate)


def parse_http_request(voice_id: str, query: dict[str, str], body: object, models: Models, voices: VoiceMap,
                       max_chars: int) -> tuple[str, ContextConfig, OutputFormat]:
    """-> (text, context config, output format); raises SessionError. `model_id`: a served model's name, or
    ElevenLabs' (the default's alias)."""
    if not isinstance(body, dict):
        raise SessionError("invalid_request", "the body must be a JSON object")
    text = field_of(body, "text", str, required=True)
    if not text.strip():
        raise SessionError("invalid_request", "text is empty")
    if len(text) > max_chars:
        raise SessionError("text_too_long", f"text is limited to {max_chars} characters")
    model = field_of(body, "model_id", str)
    info = models.info_for(model)
    try:
        voice = voices.resolve("elevenlabs", voice_id, info.voices)
    except UnknownVoice as e:
        raise SessionError("voice_not_found", str(e)) from None
    output = parse_output_format(query.get("output_format", "mp3_44100_128"))
    latency = query.get("optimize_streaming_latency")
    if latency is not None and query_int(latency, 0, LATENCY_LEVELS[-1]) is None:
        raise SessionError("invalid_request", "optimize_streaming_latency must be an integer from 0 to 4")
    for name in ("language_code", "previous_text", "next_text"):
        field_of(body, name, str)
    normalization(field_of(body, "apply_text_normalization", str))
    field_of(body, "audio_effects", dict)
    settings = voice_settings(body)
    for name in ("pronunciation_dictionary_locators", "previous_request_ids", "next_request_ids"):
        field_of(body, name, list)
    seed = integer(body, "seed", 0, MAX_SEED, code="invalid_request")
    config = ContextConfig(voice=voice, language=resolve_language(field_of(body, "language_code", str),
                                                                  info.languages),
                           format=http_format(output), sampling=SamplingParams(seed=seed), model=model, **settings)
    return text, config, output


def http_error(status: int, code: str, message: str) -> Respond:
    """ElevenLabs' HTTP error: {"detail": {"status", "message"}}."""
    return Respond(status, "application/json", json.dumps({"detail": {"status": code, "message": message}}).encode(),
                   error=code)


class ElevenLabsSpeech(HttpSpeech):
    """The audio as a body of the output format (`timestamps` False), or with estimated character
    timings (sessions/alignment.py): one JSON object (not streamed) or one JSON object per line."""

    def __init__(self, session: Session, text: str, output: OutputFormat, timestamps: bool, streamed: bool):
        super().__init__(session, text, streamed)
        self.timestamps = timestamps
        fmt = http_format(output)
        self.content_type = "application/json" if timestamps else ENCODINGS[fmt.encoding][1]
        self.timeline = Timeline(speed=session.defaults.speed)
        self.timeline.add_text(text)
        self.spans: list = []               # the whole response's alignment

    def body(self, ev: AudioOut) -> list[bytes]:
        if not self.timestamps:
            return [ev.payload]
        span, _ = self.timeline.audio(ev.duration_ms)
        if not self.streamed:
            self.spans.append(span)
            return [ev.payload]
        return [self._line(ev.payload, span)]

    def end(self, ev: ContextFinished) -> list[bytes]:
        if not self.timestamps:
            return []
        span, _ = self.timeline.end_segment()       # characters the estimate had not placed yet
        if not self.streamed:
            self.spans.append(span)
            return []
        return [self._line(b"", span)] if span is not None else []

    def whole(self, pieces: list[bytes]) -> bytes:
        if not self.timestamps:
            return b"".join(pieces)
        alignment = {"characters": [], "character_start_times_seconds": [], "character_end_times_seconds": []}
        for span in filter(None, self.spans):
            for k, v in span.as_elevenlabs_http().items():
                alignment[k] += v
        return json.dumps({"audio_base64": base64.b64encode(b"".join(pieces)).decode(), "alignment": alignment,
                           "normalized_alignment": alignment}).encode()

    def error(self, status: int, code: str, message: str) -> Respond:
        return http_error(status, code, message)

    @staticmethod
    def _line(audio: bytes, span) -> bytes:
        alignment = span.as_elevenlabs_http() if span is not None else None
        return (dumps({"audio_base64": base64.b64encode(audio).decode(), "alignment": alignment,
                       "normalized_alignment": alignment}) + "\n").encode()
