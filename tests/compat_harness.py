"""Drive a Sans-I/O protocol object (sessions/*.py) with no engine and no socket: feed it client
messages and assert the wire actions it returns and the engine commands it hands over (taken after every
call, as the gateway's I/O layer takes them); feed it engine events built here (AudioChunk with PCM,
ContextDone, ContextFailed) and assert what goes out. The outbox behaves like the gateway's: Send queues a
frame, Purge drops the queued frames of a stream, Close ends it. Events of a context that was cancelled or
ended are dropped before the protocol, as the gateway's engine client drops them (server/engine_client.py).

    h = Harness(tokenizer, lambda session: ElevenLabsProtocol(session, ...))
    h.ready(); h.send({...}); ctx = h.opened()[-1]; h.speak(ctx, 3); frames = h.deliver()
    h.finish()      # every flush and end of text is answered as the engine answers it, until none is left
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from talkgate.sessions.actions import Close, Purge, Send
from talkgate.sessions.limits import Limits
from talkgate.sessions.models import Model, Models
from talkgate.sessions.session import Session
from talkgate.synth.api import (
    FRAME_SAMPLES, AppendText, AudioChunk, CancelContext, ContextDone, ContextFailed, EndText, FlushText, MakeVoice,
    ModelInfo, OpenContext, TextSpoken, VoiceFailed, event_key,
)
from talkgate.synth.checkpoint import LANGUAGES, SPEAKERS
from talkgate.synth.tokenizer import StreamingTokenizer

# what a custom_voice checkpoint made by talkgate's writer reports (the sessions check against it), as a 1.7B one that
# reads instructions (the vendors' emotion and style controls are instructions: sessions/expression.py)
INFO = ModelInfo(name="tiny", model_type="custom_voice", size="tiny", untrained=True, end_of_speech="text_length_rule",
                 takes_instructions=True,
                 voices=tuple(SPEAKERS),
                 languages=("auto",) + tuple(name for name in LANGUAGES if "dialect" not in name))


# what a server of one model serves (the HTTP parsers take the served models)
ONE_MODEL = Models([Model("tiny", INFO)])
# two served models for the routing tests: the default first, then another CustomVoice checkpoint whose one voice
# the default lacks (a voice looked up on the wrong model is refused)
OTHER_INFO = replace(INFO, name="other", voices=("solo",))
TWO_MODELS = Models([Model("tiny", INFO), Model("other", OTHER_INFO)])


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
    def __init__(self, tokenizer, make, limits: Limits | None = None, clock: Clock | None = None,
                 models: Models | None = None, player: bool = False):
        # the outbox is drained only when a test says so: allow a whole utterance to wait in it
        self.limits = limits or Limits(max_text_chars=400, max_backlog_ms=60_000)
        self.clock = clock or Clock()
        self.session = Session(INFO, self.limits, lambda: StreamingTokenizer(tokenizer), clock=self.clock,
                               models=models, player=player)
        self.proto = make(self.session)
        self.outbox: list[Send] = []
        self.delivered: list = []       # JSON objects (dict) and binary frames (bytes), in order
        self.commands: list = []        # engine commands returned, in order
        self.close: Close | None = None
        self.purged: list[int] = []
        self.frames: dict[int, int] = {}    # context -> frames fed so far
        self.answered: dict[int, int] = {}  # context -> its FlushText / EndText answered so far
        self._ended: set[int] = set()       # contexts (voice requests) a ContextDone / ContextFailed (VoiceFailed) ended

    def apply(self, actions: list) -> list:
        self.commands += self.proto.engine_commands()
        for a in actions:
            if isinstance(a, Send):
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
        return [c for c in self.opened() if c not in self._over()]

    def _over(self) -> set[int]:
        return {c.context for c in self.commands if isinstance(c, CancelContext)} | self._ended

    def text_ids(self, context: int) -> list[int]:
        return [i for c in self.commands if isinstance(c, (AppendText, FlushText, EndText)) and c.context == context
                for i in c.ids]

    def ended_text(self, context: int) -> bool:
        return any(isinstance(c, EndText) and c.context == context for c in self.commands)

    # ----- what the engine says -----
    def event(self, ev) -> list:
        """The protocol's answer to one engine event; [] for an event of a context (voice request) that is over,
        which the gateway drops before the protocol."""
        key = event_key(ev)
        asked = {c.request if isinstance(c, MakeVoice) else c.context for c in self.commands
                 if isinstance(c, (OpenContext, MakeVoice))}
        if key not in asked or key in self._over():
            return []
        if isinstance(ev, (ContextDone, ContextFailed, VoiceFailed)):
            self._ended.add(key)
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
        """Play the engine, until nothing is left to answer: each FlushText or EndText of a live context, in
        order, is answered as the engine answers it: `frames` frames if text came since the one before,
        then TextSpoken (a flush: the context stays open) or ContextDone (the end)."""
        while any([self.answer(c, frames) for c in self.live()]):
            pass

    def answer(self, context: int, frames: int = 3) -> bool:
        """Answer the context's next FlushText or EndText (False if there is none)."""
        cmds = [c for c in self.commands if isinstance(c, (AppendText, FlushText, EndText)) and c.context == context]
        marks = [i for i, c in enumerate(cmds) if not isinstance(c, AppendText)]
        done = self.answered.get(context, 0)
        if done >= len(marks):
            return False
        self.answered[context] = done + 1
        first = marks[done - 1] + 1 if done else 0
        said = any(c.ids for c in cmds[first:marks[done] + 1])
        if said:
            self.audio(context, frames)
        n = self.frames.get(context, 0)
        if isinstance(cmds[marks[done]], EndText):
            self.event(ContextDone(context, "eos", n))
        else:
            self.event(TextSpoken(context, "length_rule" if said else "empty", n))
        return True

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
