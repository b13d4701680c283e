"""The one native session model: contexts of one connection, their text, audio encoding and cancel.

Sans-I/O and pure, with two outputs (as websockets' protocol core): operations (`start`, `append`, `flush_text`,
`end_text`, `cancel`, `close`, `on_engine_event`) return session events, which the caller (a protocol translator:
native, ElevenLabs, Cartesia, Deepgram, Twilio, the HTTP speech endpoints) turns into its own messages; the engine
commands they make (synth.api: OpenContext, AppendText, FlushText, EndText, CancelContext, MakeVoice) wait in the
session, in order, until the I/O layer takes them (`take_commands`) after each call and submits them. Every
compatible API is a translator onto this class, never a second implementation.

The session tokenizes: one StreamingTokenizer per context turns text deltas into the token ids the
engine takes. It resolves voices (sessions/voices.py Voices: a voice of the model, or a stored cloned
voice's VoicePrompt, looked up at each context start); a context with its own reference audio (Reference)
sends MakeVoice first and holds its text commands until VoiceMade opens it. Engine events come back
through `on_engine_event`, only those of the session's active contexts: the engine's client drops the events of a
context that ended meanwhile (server/engine_client.py), so that stale audio already in flight when a cancel
happened never reaches the client. One thread (the connection's event loop) touches a session.
"""
from __future__ import annotations

import enum
import itertools
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from talkgate.codecs import FormatError, make_stream_encoder
from talkgate.codecs.tempo import MAX_SPEED, MIN_SPEED, TempoStretcher
from talkgate.sessions.expression import instructions, unsupported
from talkgate.sessions.fields import SessionError, show
from talkgate.sessions.limits import Limits
from talkgate.sessions.models import Model, Models, model_name
from talkgate.sessions.voices import Voices
from talkgate.synth.api import (
    SEED_RANGE, AppendText, AudioChunk, CancelContext, ContextDone, ContextFailed, ContextParams, EndText,
    EngineCommand, EngineEvent, FlushText, MakeVoice, ModelInfo, OpenContext, SamplingParams, TextSpoken,
    VoiceFailed, VoiceMade, event_key, seed_fits,
)
from talkgate.synth.request import text_seconds

MAX_VOLUME = 4.0                # the largest gain a context takes (Cartesia's volume reaches 2, DashScope's 100 is 2)
PLAYER_TOLERANCE_S = 0.001      # a player's stall shorter than this is not an underrun (loadgen/measure.py's too)
# frame 0 of a first token committed alone by its delta waits this long for the second token: one delta at an LLM's
# 25 tokens/s, so the hold ends no later than a first token committed by the next delta would have had its audio
FIRST_HOLD_S = 0.04
# ... or, while the engine's steps are long, this many of them (at most FIRST_HOLD_MAX_S): the second token comes with
# the third delta, a delta after a second word's, and frame 1 then waits for a step boundary, a step of the whole
# batch and the hand-over, so under load 40 ms ends before frame 1 can follow (docs/design.md)
FIRST_HOLD_STEPS = 5
FIRST_HOLD_MAX_S = 0.1


def first_hold_s(step_s: float) -> float:
    """How long a lone first token's frame 0 waits at most, the engine's step being `step_s` seconds long."""
    return min(FIRST_HOLD_MAX_S, max(FIRST_HOLD_S, FIRST_HOLD_STEPS * step_s))


@dataclass(frozen=True)
class AudioFormat:
    encoding: str = "pcm_s16le"
    sample_rate: int = 24000
    streaming: bool = True      # False: one exact file at the end (HTTP, non-streamed wav/mp3/flac)
    bitrate: int | None = None  # bit/s of a compressed encoding (mp3, opus, aac); None: the codec's default


@dataclass(frozen=True)
class Reference:
    """One context's own reference audio (a one-off cloned voice, never stored): mono float32 little-endian
    samples at 24 kHz (sessions/reference_audio.py read_clip) and the words spoken in it (ICL), or None."""

    audio: bytes
    ref_text: str | None = None


@dataclass(frozen=True)
class ContextConfig:
    voice: str | None = None        # a voice of the model, or a stored voice's id or name (sessions/voices.py)
    reference: Reference | None = None      # instead of `voice`: made by the engine for this context (MakeVoice)
    language: str = "auto"
    instructions: str | None = None
    format: AudioFormat = field(default_factory=AudioFormat)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    fixed_frames: int | None = None
    speed: float = 1.0          # tempo of the delivered audio (pitch kept): 0.25 to 4
    volume: float = 1.0         # gain of the delivered audio, 0 to MAX_VOLUME; clipped to full scale
    expression: tuple[str, ...] = ()    # vendors' emotion / style controls as instruction phrases (expression.py)
    model: str | None = None    # a served model's name or a vendor's alias (sessions/models.py); None: by the voice


# ----- session events (what a wire protocol turns into messages) -----
@dataclass(frozen=True)
class ContextStarted:
    context_id: str
    stream: int
    format: AudioFormat


@dataclass(frozen=True)
class AudioOut:
    context_id: str
    stream: int
    encoding: str
    seq: int
    start_ms: float
    duration_ms: float
    payload: bytes


@dataclass(frozen=True)
class FirstAudio:
    context_id: str
    ttfa_ms: float
    frames: int
    audio_ms: float


@dataclass(frozen=True)
class ContextFinished:
    context_id: str
    stream: int
    reason: str
    frames: int
    audio_ms: float
    ttfa_ms: float | None
    text_tokens: int            # the text's token ids the engine took


@dataclass(frozen=True)
class FlushSpoken:
    """The audio of the context's text up to a flush_text is all out; the context is open for more."""
    context_id: str
    stream: int
    reason: str
    frames: int
    audio_ms: float


@dataclass(frozen=True)
class ContextCancelled:
    context_id: str
    stream: int
    audio_ms_sent: float


@dataclass(frozen=True)
class ContextError:
    context_id: str | None
    code: str
    message: str
    fatal: bool                 # True: the context is over
    stream: int | None = None   # set when fatal: its queued audio must be dropped


SessionEvent = (ContextStarted | AudioOut | FirstAudio | FlushSpoken | ContextFinished | ContextCancelled
                | ContextError)


class State(enum.Enum):
    OPEN = "open"            # accepting text
    FLUSHED = "flushed"      # text complete, audio still coming
    OVER = "over"            # finished, cancelled or failed


@dataclass
class _Context:
    context_id: str                 # the client's name for it
    stream: int                     # its number on the wire (native binary header)
    context: int                    # the engine's
    encoder: object
    tokenizer: object               # synth.tokenizer.StreamingTokenizer
    tempo: object | None = None     # codecs.tempo.TempoStretcher when speed != 1
    gain: float = 1.0               # the context's volume
    state: State = State.OPEN
    held: list | None = None        # its engine commands while the engine makes its voice (Reference)
    params: ContextParams | None = None     # its OpenContext's, until then
    model: str | None = None        # the served model it runs on
    text_chars: int = 0
    by_ids: bool | None = None      # its text came as token ids (append_ids), as text (append), or none yet
    t_first_text: float | None = None
    ttfa_ms: float | None = None
    t_first_audio: float | None = None
    frames: int = 0
    seq: int = 0
    audio_ms_emitted: float = 0.0
    audio_ms_sent: float = 0.0          # written to the socket
    play_end: float | None = None       # when a real-time player fed by the writes, started at the first, runs dry
    spoken_ms: list = field(default_factory=list)   # audio_ms_emitted at each flush's end not yet written: the
                                                    # player waits for the next text there by design, not an underrun
    audio_ms_delivered: float = 0.0     # taken by the client (left the server's socket buffer)
    text_tokens: int = 0                # text token ids handed to the engine
    lone_first: bool = False            # its first token was committed alone, by its own delta (Session._lone_first)
    boundaries: deque = field(default_factory=deque)    # [pause ms, speed or None] of each flush not yet spoken
    first_held: list | None = None      # frame 0's AudioOuts while held for the second token (Session._audio)
    hold_until: float = 0.0             # ... until then (session clock) at the latest


def _encoder(fmt: AudioFormat):
    return make_stream_encoder(fmt.encoding, fmt.sample_rate, streaming=fmt.streaming, bitrate=fmt.bitrate)


class Observer:
    """What a session reports for metrics; the gateway passes one that records them."""

    def started(self) -> None: ...
    def first_audio(self, ttfa_ms: float) -> None: ...
    def audio(self, frames: int) -> None: ...
    def underrun_risk(self) -> None: ...
    def ended(self, reason: str) -> None: ...


class Account:
    """What a session's contexts draw on beyond the server's limits, and report their usage to: a client key's
    (server/usage.py KeyAccount). A refusal is an object with `code` and `message`; this account refuses nothing."""

    def start(self, stream: int): return None                   # a context of `stream` may start: None, or refused
    def characters(self, stream: int, n: int): return None      # n more characters of its text: None, or refused
    def ended(self, stream: int, model: str) -> None: ...        # the session is done with it


class Session:
    """Contexts of one connection. `new_tokenizer()` -> a StreamingTokenizer; `contexts`: where engine
    context ids come from (the gateway shares one counter among its sessions: ids are unique per engine
    client); `clock` is injectable for tests (seconds, monotonic).

    A context's life ends in one place, `_end`, on every path: done, failed, cancelled, the connection
    gone, or an exception while handling it (the context ends, then the exception goes on to the
    protocol's error funnel). `_end` queues the CancelContext unless the engine ended it itself, and
    queued commands always go out (the I/O layer takes them after every call, one that raised too), so no
    path leaves an engine slot held.

    A first token committed alone by its delta (nothing pending after it: "好的") lets the engine speak frame 0 at
    once, while frame 1 needs the second token, a delta and a step later: a player fed frame 0 alone runs dry. So
    that frame's audio is held (its AudioOut and FirstAudio events not returned yet) until the second token is
    committed, the text ends or is flushed, the engine says more of that context, or first_hold_s() of the engine's
    step passes (FIRST_HOLD_S, longer under load): `tick()` returns what is due, `due_in()` says when the I/O layer
    must call it."""

    def __init__(self, info: ModelInfo, limits: Limits, new_tokenizer: Callable[[], object],
                 defaults: ContextConfig | None = None, observer: Observer | None = None,
                 clock: Callable[[], float] = time.perf_counter, contexts: Iterator[int] | None = None,
                 voices: Voices | None = None, models: Models | None = None, player: bool = False):
        """`voices`: what a `voice` may name (default: the model's voices only); `models`: the served models a
        context may be for (default: `info`'s alone); `player`: the client plays the audio as it comes (a
        WebSocket's), so its contexts run at most limits.stream_lead_s of audio ahead of it (ContextParams.lead_s)."""
        self.info, self.limits, self.new_tokenizer, self.clock = info, limits, new_tokenizer, clock
        self.lead_s = limits.stream_lead_s if player else None
        self.voices = voices or Voices(info)
        self.models = models or Models([Model(model_name(info.name), info)])
        self.observer = observer or Observer()
        self.contexts = contexts if contexts is not None else itertools.count(1)
        self.defaults = self._checked(defaults or ContextConfig())[0]
        self.accepting = True           # False once the client said it is done: no new contexts
        self._by_id: dict[str, _Context] = {}
        self._by_context: dict[int, _Context] = {}
        self._by_stream: dict[int, _Context] = {}
        self._next_stream = 1
        self._commands: list[EngineCommand] = []
        self._holding: dict[int, _Context] = {}     # by stream: contexts whose frame 0 is held (first_held)
        self.account = Account()        # the gateway's KeyAccount for a client with a key

    # ----- configuration -----
    def configure(self, **overrides) -> ContextConfig:
        self.defaults = self._checked(replace(self.defaults, **overrides))[0]
        return self.defaults

    def _model(self, cfg: ContextConfig, context_id: str | None = None) -> Model:
        """The served model a context of `cfg` is for (sessions/models.py's rules)."""
        voice, made_by = cfg.voice, None
        if cfg.reference is not None:
            made_by = {}
        elif voice is not None and voice.lower() not in self.models.voices():
            found = self.voices.stored(voice)
            made_by = found.model if found is not None else None
        return self.models.route(cfg.model, voice, made_by, cfg.instructions is not None, context_id)

    def _checked(self, cfg: ContextConfig, context_id: str | None = None) -> tuple[ContextConfig, Model]:
        """`cfg` checked against the model it is for -> (cfg with its voice and language canonical, that model)."""
        model = self._model(cfg, context_id)
        info = model.info
        if cfg.voice is not None:
            cfg = replace(cfg, voice=self.voices.resolve(cfg.voice, context_id, info)[0])
        if cfg.reference is not None and not info.clones:
            raise SessionError("invalid_params", "reference audio (a cloned voice) needs a Base checkpoint; this "
                               f"server's model is {info.model_type}", context_id)
        language = (cfg.language or "auto").lower()
        if language not in info.languages:
            raise SessionError("unknown_language", f"unknown language {show(cfg.language)}; available: "
                               f"{', '.join(info.languages)}", context_id)
        if not MIN_SPEED <= cfg.speed <= MAX_SPEED:
            raise SessionError("invalid_params", f"speed must be between {MIN_SPEED} and {MAX_SPEED}", context_id)
        if not 0.0 <= cfg.volume <= MAX_VOLUME:
            raise SessionError("invalid_params", f"volume must be between 0 and {MAX_VOLUME:g}", context_id)
        if cfg.expression and not info.takes_instructions:
            raise unsupported(cfg.expression, info.model_type, info.size, context_id)
        if cfg.fixed_frames is not None and not (1 <= cfg.fixed_frames <= 100_000):
            raise SessionError("invalid_params", "fixed_frames must be between 1 and 100000", context_id)
        if cfg.sampling.seed is not None and not seed_fits(cfg.sampling.seed):
            raise SessionError("invalid_params", f"seed must fit in 64 bits ({SEED_RANGE})", context_id)
        try:
            _encoder(cfg.format)
        except FormatError as e:
            raise SessionError("invalid_format", str(e), context_id) from None
        return replace(cfg, language=language), model

    # ----- operations -----
    @property
    def active(self) -> list[str]:
        return list(self._by_id)

    def has(self, context_id: str) -> bool:
        return context_id in self._by_id

    def start(self, context_id: str, **overrides) -> list:
        if not self.accepting:
            raise SessionError("session_closing", "the session is closing: no new contexts", context_id)
        if context_id in self._by_id:
            raise SessionError("context_exists", f"context {context_id!r} is already active", context_id)
        if len(self._by_id) >= self.limits.max_contexts_per_connection:
            raise SessionError("too_many_contexts", "too many contexts on this connection (limit "
                               f"{self.limits.max_contexts_per_connection}); flush or cancel one first", context_id)
        cfg, model = (self._checked(replace(self.defaults, **overrides), context_id) if overrides
                      else (self.defaults, self._model(self.defaults, context_id)))
        if (refused := self.account.start(self._next_stream)) is not None:
            raise SessionError(refused.code, refused.message, context_id)
        ctx = _Context(context_id, self._next_stream, next(self.contexts), _encoder(cfg.format), self.new_tokenizer(),
                       None if cfg.speed == 1.0 else TempoStretcher(cfg.speed),
                       model=None if model is self.models.default else model.name,   # None: the default's engine
                       gain=cfg.volume)
        self._next_stream += 1
        self._by_id[context_id] = self._by_context[ctx.context] = self._by_stream[ctx.stream] = ctx
        self.observer.started()
        # a stored voice is looked up again at each start: one deleted since session.config is unknown now
        voice, prompt = (self.voices.resolve(cfg.voice, context_id, model.info) if cfg.voice is not None
                         else (None, None))
        params = ContextParams(voice=None if prompt is not None else voice, voice_prompt=prompt,
                               language=cfg.language, instructions=instructions(cfg.instructions, cfg.expression),
                               sampling=cfg.sampling, fixed_frames=cfg.fixed_frames, lead_s=self.lead_s)
        if cfg.reference is not None:       # the context opens once its voice is made (VoiceMade)
            ctx.held, ctx.params = [], replace(params, voice=None)
            self._commands.append(MakeVoice(ctx.context, cfg.reference.audio, cfg.reference.ref_text, ctx.model))
        else:
            self._commands.append(OpenContext(ctx.context, params, ctx.model))
        return [ContextStarted(context_id, ctx.stream, cfg.format)]

    def append(self, context_id: str, text: str, whole: bool = False) -> list:
        """Text for a context (started here if it is not yet); `whole`: it is all of the context's text (see
        whole_text), tokenized in one encoding."""
        out, ctx = self._taking(context_id, False if text else None)
        if not text:
            return out
        if failed := self._counted(ctx, text):
            return out + failed
        try:
            ids = ctx.tokenizer.whole(text) if whole else ctx.tokenizer.feed(text)
        except Exception:
            self._end(ctx, "failed")
            raise
        first = ctx.text_tokens == 0
        self._text(ctx, AppendText(ctx.context, tuple(ids), text_seconds(text)))
        if ids and first:
            ctx.lone_first = len(ids) == 1 and not ctx.tokenizer.pending
        elif ids:                                   # the second token: frame 1 can follow a held frame 0
            out += self._released(ctx)
        return out

    def append_ids(self, context_id: str, ids: list[int]) -> list:
        """Token ids for a context (started here if it is not yet), made by a client whose LLM speaks Qwen's
        tokenizer: committed at once, where text waits for the proof that its last token is whole (the next delta,
        a word later for English). A context takes token ids or text, not both; the limits count the ids' text."""
        out, ctx = self._taking(context_id, True if ids else None)
        if not ids:
            return out
        try:
            text = ctx.tokenizer.take_ids(ids)
        except ValueError as e:                     # not this model's text tokens: the context goes on
            raise SessionError("invalid_params", f"ids: {e}", context_id) from None
        if failed := self._counted(ctx, text):
            return out + failed
        self._text(ctx, AppendText(ctx.context, tuple(ids), text_seconds(text)))
        return out                                  # nothing held: an ids context's frame 0 never is (_lone_first)

    def _taking(self, context_id: str, by_ids: bool | None) -> tuple[list, _Context]:
        """The context that takes more text (started here if it is not yet: its events), open, and taking text
        the way it took it before: as token ids (`by_ids` True) or as text (False; None: nothing this time)."""
        out = [] if context_id in self._by_id else self.start(context_id)
        ctx = self._by_id[context_id]
        if ctx.state is not State.OPEN:
            raise SessionError("context_closed", f"context {context_id!r} was flushed: start a new context "
                               "for more text", context_id)
        if by_ids is not None:
            if ctx.by_ids not in (None, by_ids):
                raise SessionError("invalid_params", f"context {context_id!r} takes "
                                   f"{'token ids' if ctx.by_ids else 'text'}: a context takes text or token ids, "
                                   "not both", context_id)
            ctx.by_ids = by_ids
        return out, ctx

    def _counted(self, ctx: _Context, text: str) -> list:
        """`text` counted against the context's limit and the client's account: [] when it may go on, else the
        context's failure."""
        if ctx.text_chars + len(text) > self.limits.max_text_chars:
            return self._fail(ctx, "text_too_long", "text of one context is limited to "
                              f"{self.limits.max_text_chars} characters")
        if (refused := self.account.characters(ctx.stream, len(text))) is not None:
            return self._fail(ctx, refused.code, refused.message)
        ctx.text_chars += len(text)
        if ctx.t_first_text is None:
            ctx.t_first_text = self.clock()
        return []

    def whole_text(self, context_id: str, text: str) -> list:
        """A context's whole text at once (an HTTP request's): append and end_text, its ids one encoding of the
        text as the reference makes them."""
        out = self.append(context_id, text, whole=True)
        return out + self.end_text(context_id) if self.has(context_id) else out

    def end_text(self, context_id: str) -> list:
        """The context's text is complete: the tokenizer's held-back tail goes out with EndText; the engine ends
        the context once its audio is made (ContextFinished)."""
        ctx = self._get(context_id)
        if ctx.state is not State.OPEN:
            return []
        ctx.state = State.FLUSHED
        if ctx.t_first_text is None:            # nothing to say: end it without a frame
            return self._finish(ctx, "empty")
        try:
            tail = ctx.tokenizer.finish()
        except Exception:
            self._end(ctx, "failed")
            raise
        self._text(ctx, EndText(ctx.context, tuple(tail)))
        return self._released(ctx)

    def flush_text(self, context_id: str, pause_ms: float = 0.0, speed: float | None = None) -> list:
        """Speak the text so far and keep the context open for more (the compatible APIs' flush): the
        tokenizer's held-back tail goes out with FlushText, and the engine's TextSpoken follows that audio. The text
        limit counts from here anew. At the flush's end `pause_ms` of silence follows its audio, and the text after
        it is spoken at `speed` (None: as before): SSML's break and prosody rate."""
        ctx = self._get(context_id)
        if ctx.state is not State.OPEN:
            raise SessionError("context_closed", f"context {context_id!r} was flushed: start a new context "
                               "for more text", context_id)
        try:
            tail = ctx.tokenizer.finish()
        except Exception:
            self._end(ctx, "failed")
            raise
        ctx.text_chars = 0
        ctx.boundaries.append([pause_ms, speed])
        self._text(ctx, FlushText(ctx.context, tuple(tail)))
        return self._released(ctx)

    def at_boundary(self, context_id: str, pause_ms: float = 0.0, speed: float | None = None) -> list:
        """A pause and a speed where the context's text stands, every character of it flushed: at the end of the
        last flush not yet spoken, else now (its audio is all out)."""
        ctx = self._get(context_id)
        released = self._released(ctx)         # a held frame 0 goes before the pause
        if ctx.boundaries:
            last = ctx.boundaries[-1]
            last[0] += pause_ms
            last[1] = speed if speed is not None else last[1]
            return released
        if speed is not None:
            self.set_speed(context_id, speed)
        return released + self._silence(ctx, pause_ms)

    def set_speed(self, context_id: str, speed: float) -> None:
        """The context's audio from here on is at `speed` (a pitch-kept tempo, 0.25 to 4). For a change between two
        flushed segments (Deepgram's Configure): at a flush's end the stretcher gave out all it held, so nothing of
        the previous segment is stretched anew. The caller checks the speed (the session's defaults: `configure`)."""
        ctx = self._get(context_id)
        ctx.tempo = None if speed == 1.0 else TempoStretcher(speed)

    def cancel(self, context_id: str | None = None) -> list:
        """Cancel one context, or all of them (barge-in). Nothing of a cancelled context follows."""
        targets = [self._get(context_id)] if context_id is not None else list(self._by_id.values())
        out = []
        for ctx in targets:
            self._end(ctx, "cancelled")
            out.append(ContextCancelled(ctx.context_id, ctx.stream, round(ctx.audio_ms_sent, 1)))
        return out

    def close(self) -> None:
        """The connection is gone (or going): end every context (their CancelContexts queued), say nothing."""
        self.accepting = False
        for ctx in list(self._by_id.values()):
            self._end(ctx, "disconnected")

    def tick(self) -> list[SessionEvent]:
        """The held first audio whose hold (first_hold_s) has passed (the I/O layer calls this once due_in() says so)."""
        if not self._holding:
            return []
        now = self.clock()
        out: list[SessionEvent] = []
        for ctx in [c for c in self._holding.values() if now >= c.hold_until]:
            out += self._release(ctx, now)
        return out

    def due_in(self) -> float | None:
        """Seconds until tick() has held audio to release, None when none is held (asked after every call: the
        empty case costs one dict test)."""
        if not self._holding:
            return None
        return max(0.0, min(c.hold_until for c in self._holding.values()) - self.clock())

    def context_of(self, stream: int) -> int | None:
        """The engine's id of the active context on `stream` (a latency trace follows held audio by it)."""
        ctx = self._by_stream.get(stream)
        return None if ctx is None else ctx.context

    def note_sent(self, stream: int, audio_ms: float) -> None:
        """The I/O layer wrote this much audio of `stream` to the socket. A write after the moment a real-time
        player fed by these writes would have run dry is an underrun risk: the last the server can see of one. Once
        a flush's audio is all written, the next write starts a new player (the pause was the client's)."""
        ctx = self._by_stream.get(stream)
        if ctx is None:
            return
        now = self.clock()
        after_flush = False
        while ctx.spoken_ms and ctx.audio_ms_sent >= ctx.spoken_ms[0] - 0.01:     # sums of the same ms, any order
            ctx.spoken_ms.pop(0)
            after_flush = True
        if ctx.play_end is None or after_flush:
            ctx.play_end = now
        elif now > ctx.play_end + PLAYER_TOLERANCE_S:
            self.observer.underrun_risk()
            ctx.play_end = now
        ctx.play_end += audio_ms / 1000
        ctx.audio_ms_sent += audio_ms

    def note_delivered(self, stream: int, audio_ms: float) -> None:
        """This much audio of `stream` left the server: the client's TCP took it."""
        ctx = self._by_stream.get(stream)
        if ctx is not None:
            ctx.audio_ms_delivered += audio_ms

    def slow_consumers(self) -> list:
        """Fail the contexts whose client does not read: more than max_backlog_ms of their audio waits on
        the server (made and not taken by the client: outbox and socket buffer) while the client is
        behind real time, having taken over min(1 s, max_backlog_ms) less than a real-time player would
        have taken of the audio made so far, min(audio made, time since its first audio).

        So a client that stops reading is cancelled once max_backlog_ms of audio is queued for it; a
        client that reads at real time is never behind, however far generation runs ahead of it; and a
        server slower than real time has made less, all of it taken: never blamed on the client."""
        now = self.clock()
        limit = self.limits.max_backlog_ms
        grace = min(1000, limit)
        out: list = []
        for ctx in list(self._by_id.values()):
            if ctx.t_first_audio is None:
                continue
            queued = ctx.audio_ms_emitted - ctx.audio_ms_delivered
            behind = min(ctx.audio_ms_emitted, 1000 * (now - ctx.t_first_audio)) - ctx.audio_ms_delivered
            if queued > limit and behind > grace:
                out += self._fail(ctx, "slow_consumer", "the client is not reading its audio: over "
                                  f"{limit} ms of it wait unread and it is behind real time: context cancelled")
        return out

    def take_commands(self) -> list[EngineCommand]:
        """The engine commands made since the last call, in order (the I/O layer submits them). The I/O layer asks
        after every call, those of every written frame too: most find none and get the session's own empty list
        (nothing allocated), to read only."""
        commands = self._commands
        if commands:
            self._commands = []
        return commands

    def _text(self, ctx: _Context, cmd: AppendText | FlushText | EndText) -> None:
        """A context's text command: queued now, or held until its voice is made."""
        ctx.text_tokens += len(cmd.ids)
        (self._commands if ctx.held is None else ctx.held).append(cmd)

    # ----- engine events -----
    def on_engine_event(self, ev: EngineEvent) -> list:
        """An event of one of this session's active contexts (its engine client drops those of ended ones)."""
        ctx = self._by_context[event_key(ev)]
        try:
            if ctx.stream in self._holding:     # what the engine says next follows the held frame 0
                return self._released(ctx) + self.on_engine_event(ev)
            if isinstance(ev, VoiceMade):
                held, ctx.held = ctx.held or [], None
                self._commands += [OpenContext(ctx.context, replace(ctx.params, voice_prompt=ev.voice), ctx.model),
                                   *held]
                return []
            if isinstance(ev, VoiceFailed):     # the context never opened in the engine
                return self._fail(ctx, ev.code, ev.message, engine_done=True)
            if isinstance(ev, AudioChunk):
                return self._audio(ctx, ev)
            if isinstance(ev, TextSpoken):
                pause_ms, speed = ctx.boundaries.popleft() if ctx.boundaries else (0.0, None)
                events = (self._tempo_tail(ctx, speed) + self._silence(ctx, pause_ms)
                          + self._encoded(ctx, ctx.encoder.drain))
                ctx.spoken_ms.append(ctx.audio_ms_emitted)
                return events + [FlushSpoken(ctx.context_id, ctx.stream, ev.reason, ev.frames,
                                             round(ctx.audio_ms_emitted, 1))]
            if isinstance(ev, ContextDone):
                ctx.frames = ev.frames
                return self._finish(ctx, ev.reason, engine_done=True)
            if isinstance(ev, ContextFailed):
                return self._fail(ctx, ev.code, ev.message, engine_done=True)
            raise TypeError(f"unknown engine event {ev!r}")
        except Exception:
            self._end(ctx, "failed")
            raise

    def _audio(self, ctx: _Context, chunk: AudioChunk) -> list[SessionEvent]:
        now = self.clock()
        ctx.frames = chunk.first_frame + chunk.n_frames
        pcm = chunk.pcm if ctx.tempo is None else ctx.tempo.process(chunk.pcm)
        events: list[SessionEvent] = self._encoded(ctx, self._gained(ctx), pcm)
        self.observer.audio(chunk.n_frames)
        if ctx.ttfa_ms is None and events:
            if self._lone_first(ctx):
                ctx.first_held, ctx.hold_until = events, now + first_hold_s(chunk.step_s)
                self._holding[ctx.stream] = ctx
                return []
            self._first_audio(ctx, events, now)
        return events

    @staticmethod
    def _lone_first(ctx: _Context) -> bool:
        """Its one token id so far was committed by its own delta with nothing after it pending (whatever came since
        and committed nothing): the second token comes with a later delta only, so frame 1 is that far behind frame 0.
        Judged at the commit, not when frame 0 comes: a frame 0 slower than a delta finds the next delta pending, and
        its second token is still a delta further off than an English second word's. Never a context of token ids
        (append_ids): its second id is the client's next one, a token's interval later (40 ms at 25 tokens a second,
        within frame 0's 80 ms), where text's second token may wait for two more deltas to prove it whole."""
        return ctx.lone_first and ctx.text_tokens == 1 and ctx.state is State.OPEN and not ctx.boundaries

    def _first_audio(self, ctx: _Context, events: list, now: float) -> None:
        """The context's first audio goes to the client now (with `events`): its FirstAudio, timed now."""
        ctx.t_first_audio = now
        ctx.ttfa_ms = round(1000 * (now - (ctx.t_first_text or now)), 2)
        self.observer.first_audio(ctx.ttfa_ms)
        events.append(FirstAudio(ctx.context_id, ctx.ttfa_ms, ctx.frames, round(ctx.audio_ms_emitted, 1)))

    def _release(self, ctx: _Context, now: float) -> list[SessionEvent]:
        """The held frame 0 goes out now."""
        del self._holding[ctx.stream]
        events, ctx.first_held = ctx.first_held, None
        self._first_audio(ctx, events, now)
        return events

    def _released(self, ctx: _Context) -> list[SessionEvent]:
        """The held frame 0, if it is, released now (the second token, the end or a flush of the text, the engine's
        next event of the context: no more reason to wait)."""
        return self._release(ctx, self.clock()) if ctx.stream in self._holding else []

    @staticmethod
    def _gained(ctx: _Context):
        """The context's encode with its volume applied first: a gain, clipped to full scale."""
        if ctx.gain == 1.0:
            return ctx.encoder.encode
        gain = np.float32(ctx.gain)

        def encode(pcm):
            out = pcm * gain                    # one new array a frame, clipped in place
            return ctx.encoder.encode(np.clip(out, -1.0, 1.0, out=out))
        return encode

    def _encoded(self, ctx: _Context, encode, *pcm) -> list[SessionEvent]:
        """Run one encoder call (encode(pcm), drain() or flush()) and turn its packets into AudioOut events."""
        events = []
        for packet in encode(*pcm):
            events.append(AudioOut(ctx.context_id, ctx.stream, ctx.encoder.encoding, ctx.seq,
                                   round(ctx.audio_ms_emitted, 3), packet.ms, packet.data))
            ctx.seq += 1
            ctx.audio_ms_emitted += packet.ms
        return events

    def _tempo_tail(self, ctx: _Context, speed: float | None = None) -> list[SessionEvent]:
        """At a flush's end: the audio the tempo stretcher still holds goes out with its segment (a flush is answered
        once all of its audio is out), and the next segment starts a fresh stretcher at `speed` (None: the same)."""
        events = [] if ctx.tempo is None else self._encoded(ctx, self._gained(ctx), ctx.tempo.flush())
        speed = speed if speed is not None else ctx.tempo.speed if ctx.tempo is not None else 1.0
        ctx.tempo = None if speed == 1.0 else TempoStretcher(speed)
        return events

    def _silence(self, ctx: _Context, ms: float) -> list[SessionEvent]:
        samples = round(ms * self.info.sample_rate / 1000)
        return self._encoded(ctx, ctx.encoder.encode, np.zeros(samples, np.float32)) if samples > 0 else []

    def _finish(self, ctx: _Context, reason: str, engine_done: bool = False) -> list[SessionEvent]:
        events = [] if ctx.tempo is None else self._encoded(ctx, self._gained(ctx), ctx.tempo.flush())
        events += self._encoded(ctx, ctx.encoder.flush)
        self._end(ctx, reason, engine_done)
        events.append(ContextFinished(ctx.context_id, ctx.stream, reason, ctx.frames,
                                      round(ctx.audio_ms_emitted, 1), ctx.ttfa_ms, ctx.text_tokens))
        return events

    def _fail(self, ctx: _Context, code: str, message: str, engine_done: bool = False) -> list[SessionEvent]:
        self._end(ctx, "failed", engine_done)
        return [ContextError(ctx.context_id, code, message, fatal=True, stream=ctx.stream)]

    def _get(self, context_id: str) -> _Context:
        ctx = self._by_id.get(context_id)
        if ctx is None:
            raise SessionError("unknown_context", f"no active context {context_id!r}", context_id)
        return ctx

    def _end(self, ctx: _Context, reason: str, engine_done: bool = False) -> None:
        """The one place a context's life ends: the session forgets it and queues its CancelContext
        unless the engine ended it itself; audio of its stream still queued in the wire layer is purged
        there."""
        if ctx.state is State.OVER:
            return
        ctx.state = State.OVER
        self._by_id.pop(ctx.context_id, None)
        self._by_context.pop(ctx.context, None)
        self._by_stream.pop(ctx.stream, None)
        self._holding.pop(ctx.stream, None)     # a held frame 0 is dropped with its context (a cancel's, a Purge)
        ctx.first_held = None
        self.observer.ended(reason)
        self.account.ended(ctx.stream, ctx.model or self.models.default.name)
        if not engine_done:
            self._commands.append(CancelContext(ctx.context))
