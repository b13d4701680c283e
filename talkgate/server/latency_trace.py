"""`talkgate serve --trace-latency PATH`: per request, the time of each stage from the request read to its first audio
byte written, split by process, one JSON line a request (docs/operations.md; the budget: docs/design.md).

    {"endpoint": "http:/v1/audio/speech", "model": null, "context": 7, "opened": NS,
     "stages": {"read": NS, "parsed": NS, "tokenized": NS, "sent": NS,                      <- the worker
                "engine_received": NS, "scheduled": NS, "launched": NS, "codes": NS,      <- the engine process
                "decoded": NS, "handed": NS,
                "received": NS, "encoded": NS, "written": NS},                          <- the worker
     "held_ms": 0.0}

Every time is time.monotonic_ns(): CLOCK_MONOTONIC, one clock for every process of the machine, so the engine's
times (synth.api.ENGINE_STAGES, carried back with the first frame as StageTimes) and the worker's compare directly.
The worker's stages: `read` the request (HTTP: its handler began, headers read; WebSocket: the message whose text
was the context's first that could start it: the committing delta of streamed text); `parsed` the protocol's call
began (HTTP: after the JSON body was read and parsed; WebSocket: the frame is parsed inside the call); `tokenized`
the call returned with the context's first token ids; `sent` they were handed to the engine (a worker: written to
the engine's socket); `received` the step's events reached the worker's event loop; `encoded` the protocol's call
that encoded the first audio returned; `written` its bytes were handed to the socket. `opened` is the read time of
the message that started the context: before `read` when its text came later (streamed text). `model`: the served
model the context was routed to (OpenContext.model; null for the default). `held_ms`: how long the first audio was
kept after the call that received it (a first token committed alone: sessions/session.py first_hold_s; also a tempo
stretcher's first frame that made no audio yet, or Twilio's playback queue behind another context), 0 when it went
out with that call; `encoded` is then the return of the later call that let it out (a later text delta, the session's
tick), so `received` -> `encoded` holds `held_ms`.

Off by default; off, a Link has no LinkTrace (`trace is None`), the engine's contexts have no `trace` list, and
nothing is stamped or allocated. Only streamed audio formats complete a trace (a non-streamed file's first byte
is its last). Bounded: a Link holds at most MAX_OPEN traces in progress (the oldest go), each line has a fixed set
of keys, and a process writes at most MAX_TRACE_BYTES to the file (then it stops, with one warning). The lines of
several worker processes go to one file: each is one write() of an O_APPEND descriptor, so lines do not interleave.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from talkgate.server.jsonlines import JsonLines
from talkgate.synth.api import (
    ENGINE_STAGES, AppendText, AudioChunk, EndText, EngineCommand, FlushText, OpenContext, StageTimes, event_key,
)

WORKER_BEFORE = ("read", "parsed", "tokenized", "sent")
WORKER_AFTER = ("received", "encoded", "written")        # "received": the worker's stamp on StageTimes
STAGES = WORKER_BEFORE + ENGINE_STAGES + WORKER_AFTER
MAX_OPEN = 64                   # traces in progress per Link (contexts whose first audio is not written yet)
MAX_TRACE_BYTES = 64 << 20      # what one process writes to the trace file, at most (~150,000 requests)


class TraceFile(JsonLines):
    """The JSON-lines file of one process's traces (appended to, shared with the other workers): a failing write
    (a full disk) ends the tracing, never the client's connection; at most MAX_TRACE_BYTES from one process."""

    def __init__(self, path: str, max_bytes: int = MAX_TRACE_BYTES):
        super().__init__(path, "--trace-latency", mode=0o644, max_bytes=max_bytes, stop_on_error=True)


@dataclass(eq=False)
class _Trace:
    context: int
    opened: int                         # read time of the message that started the context
    model: str | None = None            # OpenContext.model: the served model it was routed to (None: the default)
    before: list | None = None          # WORKER_BEFORE times, from the call whose text can start its first frame
    engine: list | None = None          # ENGINE_STAGES times and the worker's "received"
    encoded: int = 0
    stream: int | None = None           # its audio's stream, from its first audio Send on
    kept_at: int = 0                    # the return of the call that got its first frame and let no audio out


class LinkTrace:
    """The traces of one Link's contexts (server/connection.py drives it, on the event loop)."""

    def __init__(self, out: TraceFile, endpoint: str, t_read: int = 0):
        self.out, self.endpoint = out, endpoint
        self.t_read = self.t_call = self.t_return = t_read
        self.by_context: dict[int, _Trace] = {}
        self.by_stream: dict[int, _Trace] = {}
        self.encoding: _Trace | None = None     # the trace whose event the protocol is handling, until its first audio
        self.kept: dict[int, _Trace] = {}       # by context: traces whose first frame's audio the session kept

    def read(self) -> None:
        self.t_read = time.monotonic_ns()

    def call_started(self) -> None:
        self.t_call = time.monotonic_ns()

    def call_returned(self) -> None:
        self.t_return = time.monotonic_ns()

    def traced(self, commands: list[EngineCommand]) -> list[EngineCommand]:
        """The commands, each OpenContext asking the engine for its stage times."""
        return [replace(c, params=replace(c.params, trace_latency=True)) if isinstance(c, OpenContext) else c
                for c in commands]

    def submitted(self, commands: list[EngineCommand]) -> None:
        """One call's commands went to the engine: traces begin with their contexts, and the call that gives a
        context its first text (ids, a flush or the end: what can start its first frame) is its `read` .. `sent`."""
        now = time.monotonic_ns()
        for cmd in commands:
            if isinstance(cmd, OpenContext):
                if len(self.by_context) >= MAX_OPEN:
                    self._drop(next(iter(self.by_context.values())))
                self.by_context[cmd.context] = _Trace(cmd.context, self.t_read, cmd.model)
            elif isinstance(cmd, (AppendText, FlushText, EndText)) and (cmd.ids or not isinstance(cmd, AppendText)):
                t = self.by_context.get(cmd.context)
                if t is not None and t.before is None:
                    t.before = [self.t_read, self.t_call, self.t_return, now]

    def engine_event(self, ev) -> bool:
        """Before the protocol handles `ev`; True: it is the trace's (StageTimes), not the protocol's."""
        if isinstance(ev, StageTimes):
            t = self.by_context.get(ev.context)
            if t is not None:
                t.engine = ev.stamps
            return True
        t = self.by_context.get(event_key(ev)) if isinstance(ev, AudioChunk) else None
        self.encoding = t if t is not None and t.stream is None else None
        return False

    def handled(self) -> None:
        """The protocol's call for an engine event returned: a trace still being encoded let no audio out (its
        session keeps it: sessions/session.py first_hold_s); a later call's Send of its stream completes it."""
        t, self.encoding = self.encoding, None
        if t is not None and not t.kept_at:
            t.kept_at = self.t_return
            self.kept[t.context] = t

    def queued(self, stream: int, context_of: Callable[[int], int | None]) -> None:
        """An audio Send of `stream` came out of the protocol's call: the first of the trace being encoded, or of a
        trace whose first frame was kept (`context_of(stream)`: the session's engine context of a stream)."""
        t, self.encoding = self.encoding, None
        if t is None:
            if not self.kept:
                return
            t = self.kept.get(context_of(stream))
            if t is None or t.stream is not None:
                return
        t.encoded, t.stream = self.t_return, stream
        self.by_stream[stream] = t
        self.kept.pop(t.context, None)

    def written(self, stream: int) -> None:
        """Audio of `stream` was handed to the socket: the first of a trace completes it."""
        t = self.by_stream.get(stream)
        if t is None:
            return
        now = time.monotonic_ns()
        self._drop(t)
        if t.before is None or t.engine is None or len(t.engine) != len(ENGINE_STAGES) + 1:
            return                      # a context traced only in part (its engine answered before the trace began)
        times = [*t.before, *t.engine, t.encoded, now]
        self.out.write({"endpoint": self.endpoint, "model": t.model, "context": t.context, "opened": t.opened,
                        "stages": dict(zip(STAGES, times)),
                        "held_ms": round((t.encoded - t.kept_at) / 1e6, 3) if t.kept_at else 0.0})

    def _drop(self, t: _Trace) -> None:
        self.by_context.pop(t.context, None)
        self.kept.pop(t.context, None)
        if t.stream is not None:
            self.by_stream.pop(t.stream, None)
