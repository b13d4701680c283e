"""Deepgram Flux TTS (`/v2/speak`), Sans-I/O, onto `Session`: one socket for a whole conversation, spoken in turns.

A turn is the text up to a `Flush`, Deepgram's unit of reporting. The socket's text is one utterance
(sessions/utterances.py) whose flushes are the turn boundaries, so turns follow each other in one engine context
and the voice's state carries across them; a turn flushed while the one before is still speaking waits in the
engine behind it (Deepgram's pending turns). Per turn: `SpeechStarted` before its first audio frame, its audio,
then `Flushed` and `SpeechMetadata` after its last frame, so every frame between the two belongs to it.

`Interrupt` is barge-in: everything not yet spoken is cancelled in the engine and the audio not yet written is
dropped at once (no frame of it follows), and `SpeechInterrupted` says which turn was cut and where. With
`playback_offset` (milliseconds of the session's audio the client played) that is the turn whose audio holds the
offset, possibly one whose audio is all made (the client plays behind generation), and its text is split there
(`Turn.split`); without one, the turn being made, and no split (as Deepgram). Later positions count from the
offset (Deepgram rebases the session's audio onto what was played).

`Configure{speed}` (0.5 to 1.5 in steps of 0.05, Deepgram's range; `speed` in the query too) is applied as a
pitch-kept tempo change (Session.set_speed): from the turn after the one being spoken (Deepgram's active turn keeps
its speed), at once when none is. Client mistakes are Deepgram's `Error` message, then the socket closes; a rejected
`Configure` is a `ConfigureFailure` and the socket lives on. The query is checked before the upgrade
(`parse_query`: Deepgram fails a bad connection with HTTP 400).
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from talkgate.sessions.actions import Close, close_code, send_json
from talkgate.sessions.alignment import CHARS_PER_SECOND
from talkgate.sessions.deepgram import DECIMAL, query_speed, served_model, speak_text, speed_fault, stream_format
from talkgate.sessions.expression import expressivity_phrase, unsupported
from talkgate.sessions.fields import SessionError, field_of, show
from talkgate.sessions.models import Models
from talkgate.sessions.session import AudioFormat, ContextCancelled, ContextError, Session
from talkgate.sessions.utterances import Audio, Event, SegmentDone, UtteranceDone, UtteranceProtocol
from talkgate.sessions.voices import VoiceMap

# Flux's raw rates; Deepgram also offers mulaw and alaw at 16000 Hz, which talkgate's G.711 (8 kHz) does not
RATES = {"linear16": (8000, 16000, 24000, 32000, 44100, 48000), "mulaw": (8000,), "alaw": (8000,)}
MIN_SPEED, MAX_SPEED, SPEED_STEP = 0.5, 1.5, 0.05
EXPRESSIVITY = range(-2, 3)
STREAM = "speak"
TURN_HISTORY = 64       # finished turns kept: an Interrupt's offset may fall in audio the client still plays
CONTROLS_APPLIED = {"pronunciations_applied": 0, "breaks_applied": 0, "pronunciation_warnings": 0}
# talkgate's error codes -> Deepgram's (the rest go out as they are: engine_full, internal_error, ...)
ERROR_CODES = {"invalid_json": "MESSAGE-0000", "invalid_message": "MESSAGE-0000", "unknown_type": "MESSAGE-0000",
               "message_too_large": "BIG-0000", "text_too_long": "BIG-0000", "too_many_flushes": "BIG-0000",
               "binary_message": "DATA-0000"}


@dataclass(frozen=True)
class Settings:
    """A connection's query, checked."""
    model: str
    voice: str | None
    format: AudioFormat
    speed: float | None         # None: not set
    expression: tuple[str, ...]   # `expressivity` as an instruction phrase (expression.py)
    served_model: str | None    # the served model `model` names (deepgram.py served_model); None: its voice's


def parse_query(query: dict[str, str], models: Models, voices: VoiceMap) -> Settings:
    """The query of a /v2/speak connection; raises SessionError with Deepgram's code (the upgrade is refused)."""
    model = query.get("model")
    if not model:
        raise SessionError("INVALID_MODEL", "model is required (flux-{voice}-{language})")
    served, voice = served_model(model, models, voices)
    fmt = stream_format(query, RATES)
    speed = query_speed(query, MIN_SPEED, MAX_SPEED, SPEED_STEP)
    expression: tuple[str, ...] = ()
    if "expressivity" in query:        # checked as Deepgram checks it; an instruction (expression.py)
        text = query["expressivity"]
        value = float(text) if DECIMAL.match(text) else None
        if value is None or not EXPRESSIVITY[0] <= value <= EXPRESSIVITY[-1]:
            raise SessionError("EXPRESSIVITY_OUT_OF_RANGE", f"expressivity {show(text)} is not from -2 to 2")
        if value not in EXPRESSIVITY:
            raise SessionError("EXPRESSIVITY_INCREMENT_INVALID", f"expressivity {show(text)} is not an integer")
        phrase = expressivity_phrase(int(value))
        info = models.route(served, voice).info
        if phrase is not None and not info.takes_instructions:
            raise SessionError("EXPRESSIVITY_UNSUPPORTED",
                               unsupported((phrase,), info.model_type, info.size, None).message)
        expression = () if phrase is None else (phrase,)
    return Settings(model, voice, fmt, speed, expression, served)


@dataclass(eq=False)
class Turn:
    speech_id: str
    text: str = ""
    flushed: bool = False
    start_ms: float | None = None   # where its first frame is in the session's audio; None before it
    audio_ms: float = 0.0
    done: bool = False              # all of its audio is made

    def split(self, heard_ms: float) -> tuple[str, str]:
        """Its text as heard after `heard_ms` of its audio and the rest, cut between words (a word cut short was
        not heard). The engine does not time characters: the text is spread evenly over the turn's audio once that
        is all made, laid at the alignment's fixed speaking rate (sessions/alignment.py) while it is being made."""
        text = self.text
        per_ms = len(text) / self.audio_ms if self.done and self.audio_ms else CHARS_PER_SECOND / 1000
        n = min(len(text), max(0, round(heard_ms * per_ms)))
        while 0 < n < len(text) and not text[n - 1].isspace() and not text[n].isspace():
            n -= 1
        return text[:n], text[n:]

    def metadata(self) -> dict:
        chars = len(self.text)      # no inline controls: every character is billable
        return {"speech_id": self.speech_id, "audio_duration_ms": round(self.audio_ms), "input_character_count": chars,
                "billable_character_count": chars, "controls_applied": dict(CONTROLS_APPLIED)}


class DeepgramV2Protocol(UtteranceProtocol):
    def __init__(self, session: Session, session_id: str, settings: Settings):
        super().__init__(session, session_id)
        self.model = settings.model
        self.speed = settings.speed         # as set on this session (ConfigureSuccess reports it)
        session.configure(voice=settings.voice, format=settings.format, speed=settings.speed or 1.0,
                          expression=settings.expression, model=settings.served_model)
        self.turns: deque[Turn] = deque()   # not finished: the one being spoken first; bounded by the utterance's
                                            # flushes (MAX_FLUSHES)
        self.history: deque[Turn] = deque(maxlen=TURN_HISTORY)
        self.speech_ids = itertools.count(1)
        self.audio_ms = 0.0                 # the session's audio so far (rebased onto the played offset)
        self.audio_made = False
        self.played_ms: int | None = None   # the position the last Interrupt established
        self.input_chars = 0
        self.next_speed: float | None = None    # a Configure waiting for the turn being spoken to end
        self.closing = False

    def ready(self) -> list:
        return [send_json({"type": "Connected", "request_id": self.session_id, "model_name": self.model,
                           "model_version": "talkgate", "model_uuids": [self.session_id]})]

    def idle_timeout(self) -> list:
        self.utterances.close()
        message = "no messages received within the idle timeout"
        # an Error the client reads is counted as every error is (talkgate_errors_total)
        return [send_json({"type": "Error", "code": "NET-0001", "description": message}, error="idle_timeout"),
                Close(1000, f"NET-0001: {message}")]

    def abort(self, code: str, message: str, ws_code: int) -> list:
        self.utterances.close()
        return self._error(code, message, ws_code)

    def receive_binary(self, data: bytes) -> list:
        return self._error("binary_message", "binary messages are not accepted: send JSON text messages", 1003)

    def receive_text(self, data: str) -> list:
        try:
            msg = self._parse(data)
            kind = msg.get("type")
            if kind == "Speak":
                return self._speak(msg)
            if kind == "Flush":
                return self._flush()
            if kind == "Interrupt":
                return self._interrupt(msg)
            if kind == "Configure":
                return self._configure(msg)
            if kind == "Close":
                return self._close()
            raise SessionError("unknown_type", f"unknown message type {show(kind)}: expected Speak, Flush, "
                               "Interrupt, Configure or Close")
        except SessionError as e:
            return self._error(e.code, e.message)

    # ----- client messages -----
    def _speak(self, msg: dict) -> list:
        text = speak_text(msg)
        if self.closing:
            return [_warning("CLOSING", "Speak after Close is ignored")]
        if not text:
            return []
        if not self.turns or self.turns[-1].flushed:
            self.turns.append(Turn(f"dg_sp_{next(self.speech_ids):012x}"))
        self.turns[-1].text += text
        self.input_chars += len(text)
        return self._wire(self.utterances.append(STREAM, text))

    def _flush(self) -> list:
        if not self.turns or self.turns[-1].flushed:
            return [_warning("NO_ACTIVE_SPEECH", "Flush with no text since the last one: no turn to complete")]
        turn = self.turns[-1]
        turn.flushed = True
        return self._wire(self.utterances.flush(STREAM, tag=turn))

    def _interrupt(self, msg: dict) -> list:
        offset = _playback_offset(msg)
        if not self.audio_made:
            return [_warning("NO_AUDIO_GENERATED", "the session has produced no audio yet: nothing to interrupt")]
        if offset is not None and self.played_ms is not None and offset <= self.played_ms:
            return [_warning("INVALID_INTERRUPT_OFFSET", f"playback_offset {offset} ms does not advance past "
                             f"{self.played_ms} ms, where the previous Interrupt was")]
        turn = self._heard_turn(offset) if offset is not None else None
        turn = turn or (self.turns[0] if self.turns else None)
        if turn is None:
            return [_warning("NO_ACTIVE_SPEECH", "no turn is being spoken: nothing to interrupt")]
        # barge-in: nothing not yet spoken is made or sent any more, before the report goes out
        out = self._barge_in(STREAM)
        self.turns.clear()
        self.history.clear()            # a later offset must advance past this one: no earlier turn is hit again
        report = {"type": "SpeechInterrupted"}
        if offset is None:
            report["audio_played_ms"] = self.played_ms = round(self.audio_ms)
        else:
            heard_ms = offset - turn.start_ms if turn.start_ms is not None else 0
            report["audio_played_ms"] = self.played_ms = offset
            report["text_spoken"], report["text_remaining"] = turn.split(heard_ms)
            self.audio_ms = offset
        report["metadata"] = turn.metadata()
        out.append(send_json(report))
        if self.next_speed is not None:
            self._apply_speed()
        return out

    def _heard_turn(self, offset: int) -> Turn | None:
        """The turn whose audio holds the session position `offset` (ms), if one does."""
        for turn in itertools.chain(self.history, self.turns):
            if turn.start_ms is not None and turn.start_ms <= offset < turn.start_ms + turn.audio_ms:
                return turn
        return None

    def _configure(self, msg: dict) -> list:
        speed = field_of(msg, "speed", (int, float))
        if speed is not None:
            fault = speed_fault(speed, MIN_SPEED, MAX_SPEED, SPEED_STEP)
            if fault is not None:
                return [send_json({"type": "ConfigureFailure", "code": fault[0], "field": "speed", "value": speed,
                                   "description": fault[1]}, error=fault[0])]
            self.speed = self.next_speed = float(speed)
            if not self.turns:
                self._apply_speed()
        return [send_json({"type": "ConfigureSuccess", "applied": {} if self.speed is None else {"speed": self.speed}})]

    def _apply_speed(self) -> None:
        """The speed a Configure set, from here on: for contexts started later and the one running (called between
        two turns)."""
        speed, self.next_speed = self.next_speed, None
        self.session.configure(speed=speed)
        if STREAM in self.utterances:
            self.utterances.set_speed(STREAM, speed)

    def _close(self) -> list:
        if self.closing:
            return []
        self.closing = True
        return self._wire(self.utterances.end(STREAM))      # speaks the rest, then UtteranceDone

    # ----- utterance events -> wire -----
    def _wire(self, events: list[Event]) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, Audio):
                turn = self.turns[0]
                if turn.start_ms is None:
                    out.append(self._started(turn))
                turn.audio_ms += ev.out.duration_ms
                self.audio_ms += ev.out.duration_ms
                self.audio_made = True
                out.append(self._audio_send(ev.out.payload, ev.key, ev.out.stream, ev.out.duration_ms))
            elif isinstance(ev, SegmentDone):
                if ev.tag is not None:          # a flushed turn's audio is all out (None: the end, below)
                    out += self._turn_done(self.turns.popleft())
            elif isinstance(ev, UtteranceDone):     # Close: everything is spoken
                while self.turns:
                    out += self._turn_done(self.turns.popleft())
                out.append(send_json({"type": "SessionMetadata", "total_audio_duration_ms": round(self.audio_ms),
                                      "total_input_character_count": self.input_chars,
                                      "total_billable_character_count": self.input_chars}))
                out.append(Close(1000, "closed by client"))
            elif isinstance(ev, ContextCancelled):
                out += self._purges(None, ev.stream)
            elif isinstance(ev, ContextError):
                out += self._purges(None, ev.stream)
                out += self._error(ev.code, ev.message)
        return out

    def _started(self, turn: Turn):
        turn.start_ms = self.audio_ms
        return send_json({"type": "SpeechStarted", "speech_id": turn.speech_id})

    def _turn_done(self, turn: Turn) -> list:
        turn.done = True
        self.history.append(turn)
        out = []
        if turn.start_ms is None:       # no audio: its pair of messages all the same, zero-duration
            out += [self._started(turn), _warning("NO_SYNTHESIZABLE_TEXT", "the turn's text produced no audio")]
        if turn.flushed:
            out.append(send_json({"type": "Flushed", "speech_id": turn.speech_id}))
        out.append(send_json({"type": "SpeechMetadata", **turn.metadata()}))
        if self.next_speed is not None:     # the turn that kept the old speed is over
            self._apply_speed()
        return out

    @staticmethod
    def _error(code: str, message: str, ws_code: int | None = None) -> list:
        """Deepgram's Error message, then the close (its reason starts with the code, as /v1/speak's)."""
        dg_code = ERROR_CODES.get(code, code)
        return [send_json({"type": "Error", "code": dg_code, "description": message}, error=code),
                Close(ws_code or close_code(code), f"{dg_code}: {message}")]


def _warning(code: str, description: str):
    return send_json({"type": "Warning", "code": code, "description": description})


def _playback_offset(msg: dict) -> int | None:
    """An Interrupt's playback_offset in ms ({"type": "time_ms", "value": N}), or None; raises SessionError."""
    offset = field_of(msg, "playback_offset", dict)
    if offset is None:
        return None
    if offset.get("type", "time_ms") != "time_ms":
        raise SessionError("invalid_message", "playback_offset.type must be time_ms")
    value = field_of(offset, "value", int, required=True)
    if value < 0:
        raise SessionError("invalid_message", "playback_offset.value must be at least 0")
    return value
