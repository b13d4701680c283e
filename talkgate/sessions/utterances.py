"""Client-visible utterances of the compatible APIs, each spoken as one `Session` context that stays open
across flushes.

ElevenLabs `flush`, Cartesia `flush` (and `continue`) and Deepgram `Flush` force out the text received
so far and let more text follow in the same utterance. Here a flush is the session's `flush_text`: the
engine speaks what it has (the model finishes its words) and keeps the same context open, so the
utterance goes on with the same voice state and prosody; text sent meanwhile waits in the engine until
the flushed audio is made, so audio stays in order. The context ends at the API's end of input
(`end`), on a cancel, or when the engine ends it (its frame limit, or the model's own end while text
was still open): then the utterance's next text starts a new context. An utterance also moves to a new
context at a flush boundary with nothing pending once it has spoken ROLLOVER_FRAMES (an engine context
holds 60 s of audio by default), or once it has waited RELEASE_S there for text: a context waiting for
text holds an engine slot, and a client (a Deepgram socket for a whole call) may wait for minutes
between turns; within a turn, text follows a flush sooner.

Session events come back re-keyed to the utterance (`context_id` = the client's key), plus `Audio`
(an AudioOut with its estimated alignment), `SegmentDone` (a flush's audio is out, or the last part's
at the end) and `UtteranceDone`; the session's engine commands wait in the session (Session.take_commands).
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field, replace

from talkgate.sessions.actions import Action, Purge, Send
from talkgate.sessions.alignment import CharSpan, Timeline, Word
from talkgate.sessions.fields import SessionError, load_message
from talkgate.sessions.protocol import SocketProtocol
from talkgate.sessions.session import (
    AudioOut, ContextError, ContextFinished, FlushSpoken, Session, SessionEvent,
)
from talkgate.synth.api import EngineEvent

MAX_FLUSHES = 256           # flushes of one utterance whose audio is not out yet
ROLLOVER_FRAMES = 375       # 30 s of audio: past it, an utterance continues in a new context at its next flush
RELEASE_S = 1.0             # an utterance waiting this long for text after its flushes gives its engine slot back


@dataclass(frozen=True)
class Audio:
    key: str
    out: AudioOut               # context_id = key; stream = the utterance's current session stream
    span: CharSpan | None       # estimated characters of this audio
    words: list[Word]           # words the estimate completed with it


@dataclass(frozen=True)
class SegmentDone:
    key: str
    tag: object                 # what the flush carried (Deepgram sequence_id, Cartesia flush_id); None at the end
    span: CharSpan | None       # characters left over at its end (estimate)
    words: list[Word]
    reason: str


@dataclass(frozen=True)
class UtteranceDone:
    key: str
    audio_ms: float


Event = SessionEvent | Audio | SegmentDone | UtteranceDone


@dataclass
class Utterance:
    key: str
    overrides: dict
    sid: str | None = None      # its session context, from its first text on
    frames: int = 0             # frames of that context spoken by its last spoken flush
    flushes: deque = field(default_factory=deque)     # [tag, characters] of flushes whose audio is not out yet
    open_chars: int = 0         # characters since the last flush
    idle_since: float | None = None     # its flushes are spoken and no text came since (session clock)
    ended: bool = False         # no more input: over once its audio is out
    timeline: Timeline = field(default_factory=Timeline)

    @property
    def waiting_chars(self) -> int:
        """Text behind the flush being spoken (held in the engine until it is)."""
        return sum(chars for _, chars in list(self.flushes)[1:]) + (self.open_chars if self.flushes else 0)


class Utterances:
    def __init__(self, session: Session):
        self.session = session
        self.by_key: dict[str, Utterance] = {}
        self._by_sid: dict[str, Utterance] = {}
        self._ids = itertools.count(1)

    def __contains__(self, key: str) -> bool:
        return key in self.by_key

    def __len__(self) -> int:
        return len(self.by_key)

    # ----- client operations (raise SessionError for mistakes that leave the utterance alive) -----
    def open(self, key: str, **overrides) -> Utterance:
        limit = self.session.limits.max_contexts_per_connection
        if key in self.by_key:
            raise SessionError("context_exists", f"context {key!r} is already active", key)
        if not self.session.accepting:
            raise SessionError("session_closing", "the session is closing: no new contexts", key)
        if len(self.by_key) >= limit:
            raise SessionError("too_many_contexts", f"too many contexts on this connection (limit {limit}); "
                               "finish or cancel one first", key)
        # the estimate speaks the characters at the context's speed (its delivered audio is that much shorter)
        speed = overrides.get("speed", self.session.defaults.speed)
        utt = self.by_key[key] = Utterance(key, overrides, timeline=Timeline(speed=speed))
        return utt

    def append(self, key: str, text: str) -> list[Event]:
        utt = self.by_key.get(key) or self.open(key)
        if utt.ended:
            raise SessionError("context_closed", f"context {key!r} was closed: start a new context for more text", key)
        if not text:
            return []
        limit = self.session.limits.max_text_chars
        if utt.open_chars + len(text) > limit:
            return self._fail(utt, "text_too_long", f"text between two flushes is limited to {limit} characters")
        if utt.flushes and utt.waiting_chars + len(text) > limit:
            return self._fail(utt, "text_too_long", f"over {limit} characters waiting behind the audio in progress")
        events: list = []
        try:
            if utt.sid is None:
                utt.sid = f"{utt.key}#{next(self._ids)}"
                self._by_sid[utt.sid] = utt
                utt.frames = 0
                events += self.session.start(utt.sid, **utt.overrides)
            utt.open_chars += len(text)
            utt.idle_since = None
            utt.timeline.add_text(text)
            events += self.session.append(utt.sid, text)
        except SessionError as e:
            return self._rekey(events) + self._fail(utt, e.code, e.message)
        return self._rekey(events)

    def flush(self, key: str, tag: object = None, pause_ms: float = 0.0, speed: float | None = None) -> list[Event]:
        """Speak what was sent so far. With a tag, a flush with nothing new still yields its SegmentDone
        (in order, after the audio before it). `pause_ms` of silence after it and `speed` from there on (SSML: see
        boundary)."""
        utt = self._get(key)
        if utt.ended:                   # the end of input speaks everything: nothing left to flush
            return []
        if utt.sid is None or (not utt.open_chars and tag is None):
            if tag is None or utt.sid is not None:
                return []
            return self._segment_done(utt, tag, "empty")      # no context: nothing before it is pending
        if len(utt.flushes) >= MAX_FLUSHES:
            raise SessionError("too_many_flushes", f"over {MAX_FLUSHES} flushes waiting in context {key!r}", key)
        utt.flushes.append([tag, utt.open_chars])
        utt.open_chars = 0
        return self._rekey(self.session.flush_text(utt.sid, pause_ms, speed))

    def boundary(self, key: str, pause_ms: float = 0.0, speed: float | None = None) -> list[Event]:
        """A pause and a speed where the utterance's text stands (SSML's break and prosody rate): a flush of its open
        text carrying them, or on the last flush, or now; before any text, the speed is its context's. The
        contexts it moves to later take `speed` too."""
        utt = self._get(key)
        if speed is not None:
            utt.overrides["speed"] = speed
        if utt.open_chars:
            return self.flush(key, None, pause_ms, speed)
        if utt.sid is None or utt.ended:
            return []
        return self._rekey(self.session.at_boundary(utt.sid, pause_ms, speed))

    def end(self, key: str) -> list[Event]:
        """No more input: speak the rest, then UtteranceDone."""
        utt = self.by_key.get(key) or self.open(key)
        utt.ended, utt.idle_since = True, None
        if utt.sid is None:
            return self._done(utt)
        utt.open_chars = 0
        return self._rekey(self.session.end_text(utt.sid))

    def cancel(self, key: str) -> list[Event]:
        """Stop now; the ContextCancelled (if a context was running) names the stream to purge."""
        utt = self._get(key)
        del self.by_key[key]
        if utt.sid is None:
            return []
        sid = utt.sid
        del self._by_sid[sid]
        return [replace(ev, context_id=key) for ev in self.session.cancel(sid)]

    def set_speed(self, key: str, speed: float) -> None:
        """Its running context speaks at `speed` from here on; called between two of its segments
        (Session.set_speed). The contexts it moves to later take the session's defaults."""
        utt = self._get(key)
        if utt.sid is not None:
            self.session.set_speed(utt.sid, speed)

    def cancel_all(self) -> list[Event]:
        return [ev for key in list(self.by_key) for ev in self.cancel(key)]

    def close(self) -> None:
        """The connection is gone: what was running ends (its cancels queued in the session)."""
        self.by_key.clear()
        self._by_sid.clear()
        self.session.close()

    # ----- engine events, time -----
    def on_engine_event(self, ev: EngineEvent) -> list[Event]:
        return self._rekey(self.session.on_engine_event(ev))

    def tick(self) -> list[Event]:
        """The clock: held first audio and slow consumers (session.py), and utterances that waited RELEASE_S for
        text give their engine context up."""
        out = self._rekey(self.session.tick() + self.session.slow_consumers())
        now = self.session.clock()
        for utt in list(self.by_key.values()):
            if utt.idle_since is not None and now - utt.idle_since >= RELEASE_S and not utt.ended:
                out += self._release(utt)
        return out

    # ----- internals -----
    def _get(self, key: str) -> Utterance:
        utt = self.by_key.get(key)
        if utt is None:
            raise SessionError("unknown_context", f"no active context {key!r}", key)
        return utt

    def _rekey(self, events: list[SessionEvent]) -> list[Event]:
        out: list[Event] = []
        for ev in events:
            utt = self._by_sid.get(ev.context_id)
            if utt is None:             # already cancelled or failed here
                continue
            key = utt.key
            if isinstance(ev, AudioOut):
                span, words = utt.timeline.audio(ev.duration_ms)
                out.append(Audio(key, replace(ev, context_id=key), span, words))
            elif isinstance(ev, FlushSpoken):
                tag, _ = utt.flushes.popleft()
                utt.frames = ev.frames
                out += self._segment_done(utt, tag, ev.reason)
                if not utt.flushes and not utt.open_chars and not utt.ended:
                    utt.idle_since = self.session.clock()
                    if utt.frames >= ROLLOVER_FRAMES:
                        out += self._release(utt)
            elif isinstance(ev, ContextFinished):
                if ev.context_id == utt.sid:
                    out += self._context_done(utt, ev.reason)
                else:                   # a context the utterance rolled over from
                    self._by_sid.pop(ev.context_id, None)
            elif isinstance(ev, ContextError) and ev.fatal:
                self._drop(utt)
                out.append(replace(ev, context_id=key))
            else:
                out.append(replace(ev, context_id=key))
        return out

    def _segment_done(self, utt: Utterance, tag: object, reason: str) -> list[Event]:
        span, words = utt.timeline.end_segment()
        return [SegmentDone(utt.key, tag, span, words, reason)]

    def _release(self, utt: Utterance) -> list[Event]:
        """An utterance with nothing pending ends its context (its audio is all out: it ends at once, nothing
        new to say); its next text starts a new one."""
        sid, utt.sid, utt.idle_since = utt.sid, None, None
        return self._rekey(self.session.end_text(sid))

    def _context_done(self, utt: Utterance, reason: str) -> list[Event]:
        """Its context ended: at the end of input, the utterance is done; else (the engine ended it) the
        flushes it still owed are answered and the next text starts a new context."""
        self._by_sid.pop(utt.sid, None)
        utt.sid, utt.idle_since = None, None
        out: list[Event] = []
        while utt.flushes:
            tag, _ = utt.flushes.popleft()
            out += self._segment_done(utt, tag, reason)
        if utt.ended:
            out += self._segment_done(utt, None, reason) + self._done(utt)
        return out

    def _done(self, utt: Utterance) -> list[Event]:
        self.by_key.pop(utt.key, None)
        return [UtteranceDone(utt.key, round(utt.timeline.audio_ms, 1))]

    def _fail(self, utt: Utterance, code: str, message: str) -> list[Event]:
        """The utterance cannot go on: stop it, tell the client (fatal error naming its stream)."""
        stream = None
        if utt.sid is not None and self.session.has(utt.sid):
            stream = self.session.cancel(utt.sid)[0].stream
        self._drop(utt)
        return [ContextError(utt.key, code, message, fatal=True, stream=stream)]

    def _drop(self, utt: Utterance) -> None:
        self.by_key.pop(utt.key, None)
        if utt.sid is not None:
            self._by_sid.pop(utt.sid, None)


class UtteranceProtocol(SocketProtocol):
    """What the compatible WebSocket protocols share (sessions/protocol.py): their utterances, and the frames queued
    for each."""

    def __init__(self, session: Session, session_id: str):
        self.session, self.session_id = session, session_id
        self.utterances = Utterances(session)
        # frames queued but not yet written, per stream, and whose they are: a cancel must also drop
        # the queued audio of an utterance's segments that already finished (bounded by the outbox)
        self._unsent: dict[int, int] = {}
        self._owner: dict[int, str] = {}

    def engine_event(self, ev: EngineEvent) -> list[Action]:
        return self._wire(self.utterances.on_engine_event(ev))

    def tick(self) -> list[Action]:
        return self._wire(self.utterances.tick())

    def note_sent(self, stream: int, audio_ms: float) -> None:
        self.session.note_sent(stream, audio_ms)
        left = self._unsent.get(stream, 0) - 1
        if left > 0:
            self._unsent[stream] = left
        else:
            self._unsent.pop(stream, None)
            self._owner.pop(stream, None)

    def _audio_send(self, data: str | bytes, key: str, stream: int, audio_ms: float) -> Send:
        self._unsent[stream] = self._unsent.get(stream, 0) + 1
        self._owner[stream] = key
        return Send(data, stream, audio_ms)

    def _barge_in(self, key: str) -> list:
        """Utterance `key` cancelled if it runs, and every queued frame dropped: nothing not yet spoken follows
        (Deepgram's Clear and Interrupt, DashScope's response.cancel)."""
        out = self._wire(self.utterances.cancel(key)) if key in self.utterances else []
        return out + self._purges(None)

    def _purges(self, key: str | None, stream: int | None = None) -> list[Purge]:
        """Drop the queued audio of utterance `key` (of every utterance when None), and of `stream`."""
        streams = {s for s, k in self._owner.items() if key is None or k == key}
        if stream is not None:
            streams.add(stream)
        for s in streams:
            self._unsent.pop(s, None)
            self._owner.pop(s, None)
        return [Purge(s) for s in sorted(streams)]

    def connection_lost(self) -> list[Action]:
        self.utterances.close()
        return []

    def _wire(self, events: list[Event]) -> list[Action]:
        raise NotImplementedError

    def _parse(self, data: str) -> dict:
        """A client text frame -> its JSON object; raises SessionError."""
        return load_message(data, self.session.limits.max_message_bytes)
