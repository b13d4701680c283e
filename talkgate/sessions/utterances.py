"""Client-visible utterances of the compatible APIs, spoken as consecutive `Session` contexts.

ElevenLabs `flush`, Cartesia `flush` and Deepgram `Flush` force out the text received so far but let
more text follow in the same utterance, while a session context's text is over once it is flushed.
So an utterance is a queue of segments: each flush closes one, text after it opens the next. Only the
head segment runs in the engine (as one session context); the next starts when the head's audio is
over, so audio stays in order and the engine never holds two contexts of one utterance. A segment
queued behind the head waits with its text here (bounded by the text limit); generation runs faster
than real time, so the client has the head's audio queued while the next one starts.

Session events come back re-keyed to the utterance (`context_id` = the client's key), plus
`Audio` (an AudioOut with its estimated alignment), `SegmentDone` and `UtteranceDone`; the session's
engine commands pass through unchanged, in order.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field, replace

from talkgate.sessions.actions import ENGINE_COMMANDS, Action, Purge, Send
from talkgate.sessions.alignment import CharSpan, Timeline, Word
from talkgate.sessions.fields import SessionError, load_message
from talkgate.sessions.session import AudioOut, ContextError, ContextFinished, Session, SessionEvent
from talkgate.synth.api import EngineEvent

MAX_SEGMENTS = 256      # queued flushes of one utterance


@dataclass(frozen=True)
class Audio:
    key: str
    out: AudioOut               # context_id = key; stream = the running segment's session stream
    span: CharSpan | None       # estimated characters of this audio
    words: list[Word]           # words the estimate completed with it


@dataclass(frozen=True)
class SegmentDone:
    key: str
    tag: object                 # what the flush that closed it carried (Deepgram sequence_id, Cartesia flush_id)
    span: CharSpan | None       # characters left over at its end (estimate)
    words: list[Word]
    reason: str


@dataclass(frozen=True)
class UtteranceDone:
    key: str
    audio_ms: float


Event = SessionEvent | Audio | SegmentDone | UtteranceDone


@dataclass
class _Segment:
    text: list[str] = field(default_factory=list)     # waiting until the segment runs
    chars: int = 0
    flushed: bool = False
    tag: object = None
    sid: str | None = None                            # its session context while it runs


@dataclass
class Utterance:
    key: str
    overrides: dict
    segments: deque = field(default_factory=deque)
    ended: bool = False         # no more input: over once its segments are spoken
    timeline: Timeline = field(default_factory=Timeline)

    @property
    def open_segment(self) -> _Segment | None:
        return self.segments[-1] if self.segments and not self.segments[-1].flushed else None

    @property
    def waiting_chars(self) -> int:
        return sum(seg.chars for seg in self.segments if seg.sid is None)


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
        utt = self.by_key[key] = Utterance(key, overrides)
        return utt

    def append(self, key: str, text: str) -> list[Event]:
        utt = self.by_key.get(key) or self.open(key)
        if utt.ended:
            raise SessionError("context_closed", f"context {key!r} was closed: start a new context for more text", key)
        if not text:
            return []
        seg = utt.open_segment
        if seg is None:
            if len(utt.segments) >= MAX_SEGMENTS:
                raise SessionError("too_many_flushes", f"over {MAX_SEGMENTS} flushes waiting in context {key!r}", key)
            seg = _Segment()
            utt.segments.append(seg)
        limit = self.session.limits.max_text_chars
        if seg.chars + len(text) > limit:
            return self._fail(utt, "text_too_long", f"text between two flushes is limited to {limit} characters")
        # text waiting behind the running segment is held here: bounded by the same limit
        if seg.sid is None and utt.waiting_chars + len(text) > limit:
            return self._fail(utt, "text_too_long", f"over {limit} characters waiting behind the audio in progress")
        seg.chars += len(text)
        if seg.sid is not None:
            utt.timeline.add_text(text)
            return self._rekey(self.session.append(seg.sid, text))
        seg.text.append(text)
        return self._start_head(utt) if seg is utt.segments[0] else []

    def flush(self, key: str, tag: object = None) -> list[Event]:
        """Speak what was sent so far. With a tag, an empty flush still yields its SegmentDone (in order)."""
        utt = self._get(key)
        seg = utt.open_segment
        if seg is None:
            if tag is None:
                return []
            seg = _Segment()
            utt.segments.append(seg)
        seg.flushed, seg.tag = True, tag
        if seg.sid is not None:
            return self._rekey(self.session.flush(seg.sid))
        return self._start_head(utt) if seg is utt.segments[0] else []

    def end(self, key: str) -> list[Event]:
        """No more input: speak the rest, then UtteranceDone."""
        utt = self.by_key.get(key) or self.open(key)
        events = self.flush(key)
        if key in self.by_key:
            utt.ended = True
            if not utt.segments:
                events += self._done(utt)
        return events

    def cancel(self, key: str) -> list[Event]:
        """Stop now; the ContextCancelled (if a segment was running) names the stream to purge."""
        utt = self._get(key)
        del self.by_key[key]
        head = utt.segments[0] if utt.segments else None
        if head is None or head.sid is None:
            return []
        del self._by_sid[head.sid]
        return [ev if isinstance(ev, ENGINE_COMMANDS) else replace(ev, context_id=key)
                for ev in self.session.cancel(head.sid)]

    def cancel_all(self) -> list[Event]:
        return [ev for key in list(self.by_key) for ev in self.cancel(key)]

    def close(self) -> list:
        """The connection is gone: -> the engine commands that end what was running."""
        self.by_key.clear()
        self._by_sid.clear()
        return self.session.close()

    # ----- engine events, time -----
    def on_engine_event(self, ev: EngineEvent) -> list[Event]:
        return self._rekey(self.session.on_engine_event(ev))

    def slow_consumers(self) -> list[Event]:
        return self._rekey(self.session.slow_consumers())

    # ----- internals -----
    def _get(self, key: str) -> Utterance:
        utt = self.by_key.get(key)
        if utt is None:
            raise SessionError("unknown_context", f"no active context {key!r}", key)
        return utt

    def _start_head(self, utt: Utterance) -> list[Event]:
        seg = utt.segments[0]
        text = "".join(seg.text)
        seg.text.clear()
        if not text and seg.flushed:        # a flush with nothing new to say: done, no engine context
            return self._segment_done(utt, "empty")
        seg.sid = f"{utt.key}#{next(self._ids)}"
        self._by_sid[seg.sid] = utt
        events: list = []
        try:
            events += self.session.start(seg.sid, **utt.overrides)
            if text:
                utt.timeline.add_text(text)
                events += self.session.append(seg.sid, text)
            if seg.flushed and self.session.has(seg.sid):
                events += self.session.flush(seg.sid)
        except SessionError as e:
            return self._rekey(events) + self._fail(utt, e.code, e.message)
        return self._rekey(events)

    def _rekey(self, events: list[SessionEvent]) -> list[Event]:
        out: list[Event] = []
        for ev in events:
            if isinstance(ev, ENGINE_COMMANDS):
                out.append(ev)
                continue
            utt = self._by_sid.get(ev.context_id)
            if utt is None:             # already cancelled or failed here
                continue
            key = utt.key
            if isinstance(ev, AudioOut):
                span, words = utt.timeline.audio(ev.duration_ms)
                out.append(Audio(key, replace(ev, context_id=key), span, words))
            elif isinstance(ev, ContextFinished):
                out += self._segment_done(utt, ev.reason)
            elif isinstance(ev, ContextError) and ev.fatal:
                self._drop(utt)
                out.append(replace(ev, context_id=key))
            else:
                out.append(replace(ev, context_id=key))
        return out

    def _segment_done(self, utt: Utterance, reason: str) -> list[Event]:
        seg = utt.segments.popleft()
        self._by_sid.pop(seg.sid, None)
        span, words = utt.timeline.end_segment()
        out: list[Event] = [SegmentDone(utt.key, seg.tag, span, words, reason)]
        if utt.segments:
            if utt.segments[0].flushed or utt.segments[0].text:
                out += self._start_head(utt)
        elif utt.ended:
            out += self._done(utt)
        return out

    def _done(self, utt: Utterance) -> list[Event]:
        self.by_key.pop(utt.key, None)
        return [UtteranceDone(utt.key, round(utt.timeline.audio_ms, 1))]

    def _fail(self, utt: Utterance, code: str, message: str) -> list[Event]:
        """The utterance cannot go on: stop it, tell the client (fatal error naming its stream)."""
        stream, commands = None, []
        head = utt.segments[0] if utt.segments else None
        if head is not None and head.sid is not None and self.session.has(head.sid):
            for ev in self.session.cancel(head.sid):
                if isinstance(ev, ENGINE_COMMANDS):
                    commands.append(ev)
                else:
                    stream = ev.stream
        self._drop(utt)
        return [ContextError(utt.key, code, message, fatal=True, stream=stream)] + commands

    def _drop(self, utt: Utterance) -> None:
        self.by_key.pop(utt.key, None)
        for seg in utt.segments:
            if seg.sid is not None:
                self._by_sid.pop(seg.sid, None)


class UtteranceProtocol:
    """The Connection-facing surface the compatible protocols share (see sessions.native)."""

    idle_timeout_s: float | None = None     # the protocol's own inactivity timeout, if it has one

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
        return self._wire(self.utterances.slow_consumers())

    def note_sent(self, stream: int, audio_ms: float) -> None:
        self.session.note_sent(stream, audio_ms)
        left = self._unsent.get(stream, 0) - 1
        if left > 0:
            self._unsent[stream] = left
        else:
            self._unsent.pop(stream, None)
            self._owner.pop(stream, None)

    def note_delivered(self, stream: int, audio_ms: float) -> None:
        self.session.note_delivered(stream, audio_ms)

    def _audio_send(self, data: str | bytes, key: str, stream: int, audio_ms: float) -> Send:
        self._unsent[stream] = self._unsent.get(stream, 0) + 1
        self._owner[stream] = key
        return Send(data, stream, audio_ms)

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
        return self.utterances.close()

    def _wire(self, events: list[Event]) -> list[Action]:
        raise NotImplementedError

    def _parse(self, data: str) -> dict:
        """A client text frame -> its JSON object; raises SessionError."""
        return load_message(data, self.session.limits.max_message_bytes)
