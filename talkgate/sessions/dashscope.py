"""Alibaba DashScope's Qwen-TTS realtime API (`/api-ws/v1/realtime?model=qwen-tts-realtime`), Sans-I/O, onto `Session`.

The official `dashscope` SDK's QwenTtsRealtime speaks it: `session.update` sets the voice, format and mode;
`input_text_buffer.append` adds text, `input_text_buffer.commit` makes it a response, `input_text_buffer.clear`
drops the text not yet committed, `response.cancel` stops what is being spoken (barge-in), `session.finish` speaks
the rest, says `session.finished` and closes. Every event goes out as a JSON text frame; audio is base64 in
`response.audio.delta`.

The socket's text is one utterance (sessions/utterances.py) whose flushes are the commits, so responses follow each
other in one engine context and the voice's state carries across them. A response is the text of one commit:
`response.created`, `response.output_item.added`, `response.content_part.added`, its audio deltas, then
`response.audio.done`, `response.content_part.done`, `response.output_item.done` and `response.done` once its audio
is all out. The two modes differ in when text reaches the engine:
- `commit`: the client decides; text waits here (bounded by the session's max_text_chars) until its commit, and
  `clear` drops it.
- `server_commit` (DashScope's default): the server decides, and talkgate decides "at once": text goes to the engine
  as it comes, so audio starts before the text is complete; the response opens with the first text and is committed
  by `commit` or `session.finish`. Text streamed this way is already being spoken, so `clear` stops it as
  `response.cancel` does.
`response.cancel` cancels every response not yet done (each ends with `response.done`, status `cancelled`) and drops
the audio not yet written: no delta of them follows. Client mistakes are DashScope's `error` event and the socket
lives on; `session.update` after the first text is refused as DashScope refuses it (the voice and format hold for
the session).
"""
from __future__ import annotations

import base64
import itertools
import secrets
from dataclasses import dataclass

from talkgate.sessions.actions import Close, close_code, send_json
from talkgate.sessions.fields import SessionError, field_of, integer, number, show
from talkgate.sessions.session import AudioFormat, ContextCancelled, ContextError, Session
from talkgate.sessions.utterances import Audio, Event, SegmentDone, UtteranceDone, UtteranceProtocol
from talkgate.sessions.voices import UnknownVoice, VoiceMap, resolve_language

STREAM = "realtime"
MODES = ("server_commit", "commit")
DEFAULT_VOICE = "Cherry"
# response_format -> talkgate's encoding (DashScope's opus is Ogg-encapsulated)
FORMATS = {"pcm": "pcm_s16le", "wav": "wav", "mp3": "mp3", "opus": "ogg_opus"}
SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)    # the SDK's documented range (each codec narrows it)
# talkgate's error codes -> DashScope's `error.type` (the code goes out as it is); the rest are invalid requests
SERVER_ERROR_TYPES = {"internal_error": "server_error", "engine_error": "server_error",
                      "engine_stopped": "server_error", "engine_failed": "server_error", "engine_full": "server_error"}


@dataclass(frozen=True)
class Settings:
    """What a session.update set (the defaults until one comes)."""
    voice: str = DEFAULT_VOICE
    mode: str = "server_commit"
    response_format: str = "pcm"
    sample_rate: int = 24000


@dataclass(eq=False)
class Response:
    id: str
    item_id: str
    chars: int = 0
    committed: bool = False
    announced: bool = False         # response.created and its item and part are out


class DashScopeProtocol(UtteranceProtocol):
    def __init__(self, session: Session, session_id: str, model: str, voices: VoiceMap):
        super().__init__(session, session_id)
        self.model, self.voices = model, voices
        self.startup_error: SessionError | None = None
        try:        # `model`: a served model's name, or DashScope's (qwen-tts-realtime, ...: the default's alias)
            self.info = session.models.info_for(model)
        except SessionError as e:
            self.info, self.startup_error = session.info, e
        self.settings = Settings()
        self.extra: dict = {}               # the session.update fields echoed in session.updated
        self.started = False                # text came: the session's settings are fixed (DashScope's rule)
        self.pending = ""                   # commit mode: text not yet committed
        self.responses: list[Response] = []     # not done, oldest (the one being spoken) first; bounded by the
                                                # utterance's flushes (MAX_FLUSHES)
        self.last: Response | None = None       # the response done last
        self.ids = itertools.count(1)
        self.finishing = False
        if self.startup_error is None:
            voice = self._voice(DEFAULT_VOICE)
            if self.info.voices and voice not in self.info.voices:
                voice = None        # a model without DashScope's default voice speaks its own default
            session.configure(voice=voice, model=model)

    # ----- SocketProtocol -----
    def ready(self) -> list:
        if self.startup_error is not None:
            return self._error(self.startup_error.code, self.startup_error.message, "model") + [
                Close(close_code(self.startup_error.code), self.startup_error.code)]
        return [self._event("session.created", session=self._session_view())]

    def idle_timeout(self) -> list:
        self.utterances.close()
        return self._error("idle_timeout", "no message received within the idle timeout") + [
            Close(1000, "idle timeout")]

    def abort(self, code: str, message: str, ws_code: int) -> list:
        self.utterances.close()
        return self._error(code, message) + [Close(ws_code, code)]

    def receive_binary(self, data: bytes) -> list:
        return self._error("invalid_event", "binary messages are not accepted: send JSON events")

    def receive_text(self, data: str) -> list:
        try:
            msg = self._parse(data)
            kind = msg.get("type")
            if self.finishing:
                raise SessionError("invalid_event", f"{show(kind)} after session.finish")
            if kind == "session.update":
                return self._update(msg)
            if kind == "input_text_buffer.append":
                return self._append(msg)
            if kind == "input_text_buffer.commit":
                return self._commit()
            if kind == "input_text_buffer.clear":
                return self._clear()
            if kind == "response.cancel":
                return self._cancel()
            if kind == "session.finish":
                return self._finish()
            raise SessionError("invalid_event", f"unknown event type {show(kind)}: expected session.update, "
                               "input_text_buffer.append, input_text_buffer.commit, input_text_buffer.clear, "
                               "response.cancel or session.finish")
        except SessionError as e:
            return self._error(e.code, e.message, e.context_id)

    # ----- client events -----
    def _update(self, msg: dict) -> list:
        if self.started:
            raise SessionError("invalid_value", "Session update error: session already started or finished or "
                               "failed.")
        body = field_of(msg, "session", dict, {})
        config, settings, extra = _session_config(body, self.settings, self.voices, self.info)
        try:
            self.session.configure(**config)
        except SessionError as e:       # a format the codec cannot make at that rate or bit rate
            raise SessionError("invalid_value", e.message, "session.response_format") from None
        self.settings = settings
        self.extra.update(extra)
        return [self._event("session.updated", session=self._session_view())]

    def _append(self, msg: dict) -> list:
        text = field_of(msg, "text", str, required=True)
        if not text:
            return []
        self.started = True
        if self.settings.mode == "commit":
            limit = self.session.limits.max_text_chars
            if len(self.pending) + len(text) > limit:
                raise SessionError("invalid_value", f"the uncommitted text is limited to {limit} characters")
            self.pending += text
            return []
        out = []
        if not self.responses or self.responses[-1].committed:
            out += self._open()
        self.responses[-1].chars += len(text)
        return out + self._wire(self.utterances.append(STREAM, text))

    def _commit(self) -> list:
        if self.settings.mode == "commit":
            if not self.pending:
                raise SessionError("input_text_buffer_commit_empty", "the text buffer is empty: nothing to commit")
            text, self.pending = self.pending, ""
            response = Response(*self._new_ids(), chars=len(text))
            self.responses.append(response)
            out = self._committed(response) + self._wire(self.utterances.append(STREAM, text))
            if STREAM not in self.utterances:       # the engine could not take it: failed (an error event)
                return out
            return out + self._wire(self.utterances.flush(STREAM, tag=response))
        if not self.responses or self.responses[-1].committed:
            raise SessionError("input_text_buffer_commit_empty", "the text buffer is empty: nothing to commit")
        response = self.responses[-1]
        return self._committed(response) + self._wire(self.utterances.flush(STREAM, tag=response))

    def _clear(self) -> list:
        self.pending = ""
        out = []
        if self.settings.mode == "server_commit" and self.responses and not self.responses[-1].committed:
            out += self._cancel_responses()     # streamed text is being spoken already: it stops
        return out + [self._event("input_text_buffer.cleared")]

    def _cancel(self) -> list:
        if not self.responses:
            raise SessionError("response_cancel_not_active", "there is no response in progress to cancel")
        return self._cancel_responses()

    def _finish(self) -> list:
        self.finishing = True
        out = []
        if self.pending:                        # DashScope speaks what the buffer holds
            out += self._commit()
        elif self.responses and not self.responses[-1].committed:
            out += self._committed(self.responses[-1])
        return out + self._wire(self.utterances.end(STREAM))   # the rest spoken (opened if need be), UtteranceDone

    # ----- responses -----
    def _new_ids(self) -> tuple[str, str]:
        n = next(self.ids)
        return f"resp_{self.session_id}_{n}", f"item_{self.session_id}_{n}"

    def _open(self) -> list:
        response = Response(*self._new_ids())
        self.responses.append(response)
        return self._announce(response)

    def _committed(self, response: Response) -> list:
        response.committed = True
        out = [self._event("input_text_buffer.committed", item_id=response.item_id)]
        return out + self._announce(response)

    def _announce(self, response: Response) -> list:
        if response.announced:
            return []
        response.announced = True
        return [self._event("response.created", response=self._response_view(response, "in_progress")),
                self._event("response.output_item.added", response_id=response.id, output_index=0,
                            item=self._item_view(response, "in_progress")),
                self._event("response.content_part.added", **self._part_ref(response),
                            part={"type": "audio", "text": ""})]

    def _done(self, response: Response, status: str) -> list:
        out = []
        if status == "completed":
            out += [self._event("response.audio.done", **self._part_ref(response)),
                    self._event("response.content_part.done", **self._part_ref(response),
                                part={"type": "audio", "text": ""}),
                    self._event("response.output_item.done", response_id=response.id, output_index=0,
                                item=self._item_view(response, "completed"))]
        self.last = response
        view = self._response_view(response, status)
        view["output"] = [self._item_view(response, "completed" if status == "completed" else "incomplete")]
        view["usage"] = {"characters": response.chars}
        return out + [self._event("response.done", response=view)]

    def _cancel_responses(self) -> list:
        """Barge-in: nothing not yet spoken is made or sent any more, before the responses' ends go out."""
        out = self._barge_in(STREAM)
        for response in self.responses:
            out += self._announce(response) + self._done(response, "cancelled")
        self.responses.clear()
        return out

    # ----- utterance events -> wire -----
    def _wire(self, events: list[Event]) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, Audio):
                # with no response open: an encoder's closing bytes at the context's end (an MP3 frame, an Ogg
                # page), of the last response, whose response.done went out before session.finish came
                response = self.responses[0] if self.responses else self.last
                delta = base64.b64encode(ev.out.payload).decode("ascii")
                out.append(self._audio_send(self._dumps("response.audio.delta", **self._part_ref(response),
                                                        delta=delta), ev.key, ev.out.stream, ev.out.duration_ms))
            elif isinstance(ev, SegmentDone):
                # a committed response's audio is all out (None: the end, below); the last one before
                # session.finish waits for the end, which brings the encoder's closing bytes
                if ev.tag is not None and not (self.finishing and len(self.responses) == 1):
                    out += self._done(self.responses.pop(0), "completed")
            elif isinstance(ev, UtteranceDone):     # session.finish: everything is spoken
                while self.responses:
                    out += self._done(self.responses.pop(0), "completed")
                out += [self._event("session.finished"), Close(1000, "session finished")]
            elif isinstance(ev, ContextCancelled):
                out += self._purges(None, ev.stream)
            elif isinstance(ev, ContextError):
                out += self._purges(None, ev.stream)
                out += self._error(ev.code, ev.message)
                for response in self.responses:
                    out += self._announce(response) + self._done(response, "failed")
                self.responses.clear()
        return out

    # ----- event shapes -----
    @staticmethod
    def _event(kind: str, reports: str | None = None, **fields):
        """A server event; `reports`: the error code it reports, if it reports one."""
        return send_json({"event_id": f"event_{secrets.token_hex(12)}", "type": kind, **fields}, error=reports)

    def _dumps(self, kind: str, **fields) -> str:
        return self._event(kind, **fields).data

    def _part_ref(self, response: Response) -> dict:
        return {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}

    def _response_view(self, response: Response, status: str) -> dict:
        return {"id": response.id, "object": "realtime.response", "conversation_id": self.session_id,
                "status": status, "modalities": ["audio"], "voice": self.settings.voice, "output": []}

    @staticmethod
    def _item_view(response: Response, status: str) -> dict:
        content = [{"type": "audio", "text": ""}] if status != "in_progress" else []
        return {"id": response.item_id, "object": "realtime.item", "type": "message", "status": status,
                "role": "assistant", "content": content}

    def _session_view(self) -> dict:
        s = self.settings
        return {"id": f"sess_{self.session_id}", "object": "realtime.session", "model": self.model, "mode": s.mode,
                "voice": s.voice, "response_format": s.response_format, "sample_rate": s.sample_rate, **self.extra}

    def _error(self, code: str, message: str, param: str | None = None) -> list:
        """DashScope's error event; the socket lives on unless the caller closes it."""
        error = {"type": SERVER_ERROR_TYPES.get(code, "invalid_request_error"), "code": code, "message": message}
        if param is not None:
            error["param"] = param
        return [self._event("error", reports=code, error=error)]

    def _voice(self, name: str) -> str | None:
        return _voice(self.voices, name, self.info.voices)


def _voice(voices: VoiceMap, name: str, model_voices: tuple[str, ...]) -> str | None:
    try:
        return voices.resolve("dashscope", name, model_voices)
    except UnknownVoice:
        raise SessionError("invalid_value", f"unknown voice {show(name)}: add it to the voice map "
                           "(talkgate serve --voice-map)", "session.voice") from None


def _session_config(body: dict, current: Settings, voices: VoiceMap, info) -> tuple[dict, Settings, dict]:
    """A session.update's `session` -> (Session.configure's overrides, the new Settings, the other fields echoed
    back); raises SessionError invalid_value naming the field (DashScope's `param`)."""
    def checked(read, name, *args):
        try:
            return read(body, name, *args, code="invalid_value")
        except SessionError as e:
            raise SessionError("invalid_value", e.message, f"session.{name}") from None

    def text(name):
        try:
            return field_of(body, name, str)
        except SessionError as e:
            raise SessionError("invalid_value", e.message, f"session.{name}") from None

    config: dict = {}
    extra: dict = {}
    voice = text("voice")
    if voice is not None:
        config["voice"] = _voice(voices, voice, info.voices)
    mode = text("mode")
    if mode is not None and mode not in MODES:
        raise SessionError("invalid_value", f"mode {show(mode)}: expected server_commit or commit", "session.mode")
    fmt = text("response_format") or current.response_format
    if fmt not in FORMATS:
        raise SessionError("invalid_value", f"response_format {show(fmt)}: expected {', '.join(FORMATS)}",
                           "session.response_format")
    rate = checked(integer, "sample_rate", 1, 1_000_000) or current.sample_rate
    if rate not in SAMPLE_RATES:
        raise SessionError("invalid_value", f"sample_rate {rate}: expected one of "
                           f"{', '.join(map(str, SAMPLE_RATES))}", "session.sample_rate")
    bit_rate = checked(integer, "bit_rate", 6, 510)     # kbit/s, for mp3 and opus
    config["format"] = AudioFormat(FORMATS[fmt], rate, bitrate=bit_rate * 1000 if bit_rate else None)
    speed = checked(number, "speech_rate", 0.5, 2.0)
    if speed is not None:
        config["speed"] = extra["speech_rate"] = speed
    volume = checked(integer, "volume", 0, 100)     # 50 is the voice's own loudness: a gain of volume / 50
    if volume is not None:
        config["volume"], extra["volume"] = volume / 50, volume
    pitch = checked(number, "pitch_rate", 0.5, 2.0)  # checked as DashScope checks it; not applied: no pitch shift
    if pitch is not None:
        extra["pitch_rate"] = pitch
    language = text("language_type")
    if language is not None:
        config["language"] = resolve_language(language, info.languages)
        extra["language_type"] = language
    instructions = text("instructions")
    if instructions is not None:
        config["instructions"] = instructions or None
        extra["instructions"] = instructions
    settings = Settings(voice or current.voice, mode or current.mode, fmt, rate)
    return config, settings, extra
