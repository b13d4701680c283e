"""Drive a Sans-I/O protocol object (sessions/*.py) with no engine and no socket: feed it client
messages and assert the engine commands and wire actions it returns; feed it engine events built
here (AudioChunk with PCM, ContextDone, ContextFailed) and assert what goes out. The outbox behaves
like the gateway's: Send queues a frame, Purge drops the queued frames of a stream, Close ends it.

    h = Harness(tokenizer, lambda session: ElevenLabsProtocol(session, ...))
    h.ready(); h.send({...}); ctx = h.opened()[-1]; h.speak(ctx, 3); frames = h.deliver()
    h.finish()      # every context whose text ended speaks and is done, until none is left
"""
from __future__ import annotations

import json

import numpy as np

from talkgate.sessions.actions import Close, Purge, Send
from talkgate.sessions.limits import Limits
from talkgate.sessions.session import Session
from talkgate.synth.api import (
    FRAME_SAMPLES, AppendText, AudioChunk, CancelContext, ContextDone, ContextFailed, EndText, ModelInfo,
    OpenContext,
)
from talkgate.synth.checkpoint import LANGUAGES, SPEAKERS
from talkgate.synth.tokenizer import StreamingTokenizer

# what a custom_voice checkpoint made by talkgate's writer reports (the sessions check against it)
INFO = ModelInfo(name="tiny", model_type="custom_voice", size="tiny", untrained=True, end_of_speech="text_length_rule",
                 voices=tuple(SPEAKERS),
                 languages=("auto",) + tuple(name for name in LANGUAGES if "dialect" not in name))
COMMANDS = (OpenContext, AppendText, EndText, CancelContext)


class Clock:
    """An injectable session clock (seconds)."""

    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def pcm(frame: int, n_frames: int = 1) -> np.ndarray:
    """Distinct, deterministic float32 PCM for frames [frame, frame + n_frames) (a ramp of small values)."""
    start = frame * FRAME_SAMPLES
    return (np.arange(start, start + n_frames * FRAME_SAMPLES, dtype=np.float32) % 200 - 100) / 400


class Harness:
    def __init__(self, tokenizer, make, limits: Limits | None = None, clock: Clock | None = None):
        # the outbox is drained only when a test says so: allow a whole utterance to wait in it
        self.limits = limits or Limits(max_text_chars=400, max_backlog_ms=60_000)
        self.clock = clock or Clock()
        self.session = Session(INFO, self.limits, lambda: StreamingTokenizer(tokenizer), clock=self.clock)
        self.proto = make(self.session)
        self.outbox: list[Send] = []
        self.delivered: list = []       # JSON objects (dict) and binary frames (bytes), in order
        self.commands: list = []        # engine commands returned, in order
        self.close: Close | None = None
        self.purged: list[int] = []
        self.frames: dict[int, int] = {}    # context -> frames fed so far
        self._ended: set[int] = set()       # contexts a ContextDone / ContextFailed fed here ended

    def apply(self, actions: list) -> list:
        for a in actions:
            if isinstance(a, COMMANDS):
                self.commands.append(a)
            elif isinstance(a, Send):
                if self.close is None:
                    self.outbox.append(a)
            elif isinstance(a, Purge):
                self.purged.append(a.stream)
                self.outbox = [s for s in self.outbox if s.stream != a.stream]
            elif isinstance(a, Close):
                self.close = self.close or a
            else:
                raise AssertionError(f"unknown action {a!r}")
        return actions

    def ready(self) -> list:
        return self.apply(self.proto.ready())

    def send(self, msg) -> list:
        return self.apply(self.proto.receive_text(msg if isinstance(msg, str) else json.dumps(msg)))

    # ----- what the engine was told -----
    def opened(self) -> list[int]:
        return [c.context for c in self.commands if isinstance(c, OpenContext)]

    def live(self) -> list[int]:
        """Contexts opened and neither cancelled nor ended by an event fed here."""
        over = {c.context for c in self.commands if isinstance(c, CancelContext)} | self._ended
        return [c for c in self.opened() if c not in over]

    def text_ids(self, context: int) -> list[int]:
        return [i for c in self.commands if isinstance(c, (AppendText, EndText)) and c.context == context
                for i in c.ids]

    def ended_text(self, context: int) -> bool:
        return any(isinstance(c, EndText) and c.context == context for c in self.commands)

    # ----- what the engine says -----
    def event(self, ev) -> list:
        if isinstance(ev, (ContextDone, ContextFailed)):
            self._ended.add(ev.context)
        return self.apply(self.proto.engine_event(ev))

    def audio(self, context: int, n: int = 1) -> list:
        """n one-frame AudioChunks of `context`, continuing its frame count."""
        out = []
        for _ in range(n):
            frame = self.frames.get(context, 0)
            self.frames[context] = frame + 1
            out += self.event(AudioChunk(context, pcm(frame), frame, 1, 0.0))
        return out

    def speak(self, context: int, n: int = 3, reason: str = "eos") -> list:
        """n frames of audio, then the context's ContextDone."""
        out = self.audio(context, n)
        return out + self.event(ContextDone(context, reason, self.frames.get(context, 0)))

    def finish(self, frames: int = 3) -> None:
        """Play the engine: every context whose text has ended speaks `frames` frames and is done,
        until none is left (an utterance's next part starts when the one before is done)."""
        while ready := [c for c in self.live() if self.ended_text(c)]:
            for context in ready:
                self.speak(context, frames)

    def fail(self, context: int, code: str = "engine_full", message: str = "all 4 context slots are in use") -> list:
        return self.event(ContextFailed(context, code, message))

    # ----- the socket -----
    def queued(self) -> list:
        return [_load(s.data) for s in self.outbox]

    def deliver(self) -> list:
        """The socket writes everything queued and the client takes it: account it, return it."""
        out = []
        for s in self.outbox:
            if s.stream is not None:
                self.proto.note_sent(s.stream, s.audio_ms)
                self.proto.note_delivered(s.stream, s.audio_ms)
            out.append(_load(s.data))
        self.outbox = []
        self.delivered += out
        return out


def _load(data):
    return json.loads(data) if isinstance(data, str) else data


def jsons(items: list) -> list[dict]:
    return [m for m in items if isinstance(m, dict)]
