"""A client of the engine as the session layer is one (Engine.connect / submit), for tests that drive the
engine directly: one tokenizer per context, events handed to a per-context sink."""
from __future__ import annotations

import itertools
import threading

import numpy as np

from talkgate.synth.api import AppendText, AudioChunk, CancelContext, EndText, OpenContext
from talkgate.synth.request import text_seconds


class Collector:
    """One context's events; `done` is set by the last event of the context."""

    def __init__(self):
        self.events, self.done = [], threading.Event()
        self.lock = threading.Lock()

    def __call__(self, ev):
        with self.lock:
            self.events.append(ev)
        if not isinstance(ev, AudioChunk):
            self.done.set()

    def wait(self, timeout=60.0):
        assert self.done.wait(timeout), "context did not finish"
        return self

    @property
    def chunks(self):
        return [e for e in self.events if isinstance(e, AudioChunk)]

    @property
    def pcm(self):
        return np.concatenate([c.pcm for c in self.chunks])

    @property
    def last(self):
        return self.events[-1]


class Speaker:
    """A client of Engine.connect that speaks context by context, a tokenizer each (as a session does)."""

    def __init__(self, engine):
        self.engine, self.sinks, self.tokenizers, self.ids = engine, {}, {}, itertools.count(1)
        self.id = engine.connect(self.deliver)

    def deliver(self, events):
        for ev in events:
            self.sinks[ev.context](ev)

    def open(self, params, sink=None) -> int:
        ctx = next(self.ids)
        self.sinks[ctx], self.tokenizers[ctx] = sink or Collector(), self.engine.new_tokenizer()
        self.engine.submit(self.id, [OpenContext(ctx, params)])
        return ctx

    def append(self, ctx, text):
        self.engine.submit(self.id, [AppendText(ctx, tuple(self.tokenizers[ctx].feed(text)), text_seconds(text))])

    def end(self, ctx):
        self.engine.submit(self.id, [EndText(ctx, tuple(self.tokenizers[ctx].finish()))])

    def cancel(self, ctx):
        self.engine.submit(self.id, [CancelContext(ctx)])
