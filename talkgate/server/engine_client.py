"""The gateway's one client of the engine: commands out, each step's events routed to the Link (WebSocket
connection or HTTP stream) that owns their context, on the event loop. Every sink gets engine events
through this one path.

    client = EngineClient(engine, loop)     # engine: synth.api.EngineInterface (the in-process Engine, or a
                                            # worker's RemoteEngines)
    session = Session(client.info, limits, client.new_tokenizer, contexts=client.contexts)
    client.submit(link, commands)           # OpenContext makes `link` the owner of its context
    ...                                     # link.engine_event(event) on the loop, each in order
    client.forget(link)                     # the link is over: whatever it still owns is cancelled

This is the one place a gateway process drops stale events: those of a context no longer owned (cancelled, or
ended) when they are handed over. A cancel takes effect at once: neither the engine nor a worker's view of the
engines (ipc/remote_engines.py) filters what was already on its way, and a Session only ever sees events of its
active contexts. An owner's context is released by its cancel (submit) or by its last event (ContextDone,
ContextFailed; VoiceMade or VoiceFailed for a voice request) as that is handed over.

Context ids come from one counter shared by every session of this gateway (`contexts`), so they are
unique per engine client as the engine requires. A session's MakeVoice (a context's own reference audio)
uses its context's id as request id; `make_voice` (the voice store's uploads) takes an id from the same
counter: VoiceMade and VoiceFailed are routed to their owner by it like a context's events. The engine calls
`deliver` once per step, on its own thread (the batch crosses to the loop in one call_soon_threadsafe) or, for
engines over IPC, on the loop.

Routing: a step's events wait in two queues, one entry per Link, until the Link takes them. A Link with a
context at one of its first URGENT_FRAMES frames is *urgent*: its client's player has 80 ms of audio ahead of it
after the first frame, where one far into its text has seconds. Urgent Links go before every other, those of
later steps too, so a new context's first frames never wait behind the encoding (Opus, framing) of the audio
already queued for hundreds of others. A Link's events of several steps (it was not reached before the next
step came) are one entry, a context's frames of them joined into one AudioChunk (encoded and framed once); a
Link that becomes urgent takes its queued events along, so its contexts' audio stays in order. The queues are
handed over ROUTE_SLICE_S of Links a loop callback: a step's audio for a worker's hundreds of contexts is
otherwise one callback of 10-30 ms, and every client message and timer of the loop waits behind it. A step's
first slice runs as the step comes (a loop crowded with other callbacks would delay it), unless more steps
already wait to be queued (the engine thread's, on a loop that was busy): those join the queues first.
Backpressure: while the step batches not yet routed to every Link (those handed over and not yet queued, and
the steps back to the oldest queued entry) reach the engine's `max_behind`, `behind()` is true and the engine
(its `hold`) waits before its next step, or a worker stops reading steps, so the loop's backlog stays bounded
without dropping anything.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from talkgate.synth.api import (
    AudioChunk, CancelContext, ContextDone, ContextFailed, EngineCommand, EngineError, EngineInterface, MakeVoice,
    OpenContext, StageTimes, VoiceFailed, VoiceMade, VoicePrompt, event_key,
)

log = logging.getLogger("talkgate.engine_client")
ROUTE_SLICE_S = 0.002       # Links a loop callback hands their events to: until this long has passed
URGENT_FRAMES = 4           # a Link with a context at one of its first frames (320 ms of audio) goes first
LAST_EVENTS = (ContextDone, ContextFailed, VoiceMade, VoiceFailed)     # release their context (or voice request)


@dataclass(eq=False)
class _Queued:
    """One Link's events not handed over yet."""
    owner: object
    events: list
    step: int                   # the step batch of its oldest events


class EngineClient:
    def __init__(self, engine: EngineInterface, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine, loop
        self.info = engine.info
        self.new_tokenizer = engine.new_tokenizer
        self.contexts = itertools.count(1)
        self._owners: dict[int, object] = {}           # context or voice request -> its Link (on the loop only)
        self._outstanding = 0                          # batches handed over, not yet queued
        self._count_lock = threading.Lock()
        # id(Link) -> its queued events, in the order they are handed over (loop only)
        self._urgent: collections.OrderedDict[int, _Queued] = collections.OrderedDict()
        self._rest: collections.OrderedDict[int, _Queued] = collections.OrderedDict()
        self._steps = 0                                # step batches queued so far
        self._queued_steps = 0                         # of which the queues still hold some (set on the loop)
        self._slice_pending = False
        self.max_behind = engine.max_behind
        self._loop_thread = threading.get_ident()
        self.id = engine.connect(self._deliver)

    def submit(self, owner, commands: list[EngineCommand]) -> None:
        """On the loop: commands of `owner`'s session, in order."""
        for cmd in commands:
            if isinstance(cmd, OpenContext):
                self._owners[cmd.context] = owner
            elif isinstance(cmd, MakeVoice):
                self._owners[cmd.request] = owner
            elif isinstance(cmd, CancelContext):
                self._owners.pop(cmd.context, None)
        self.engine.submit(self.id, commands)

    def send_now(self) -> None:
        """On the loop: the commands submitted so far go to the engine now (synth.api.EngineInterface)."""
        self.engine.send_now()

    async def make_voice(self, audio: bytes, ref_text: str | None, timeout_s: float,
                         model: str | None = None) -> VoicePrompt:
        """On the loop: the voice made by `model`'s engine (None: the default's) from 24 kHz float32 mono samples;
        raises EngineError (the engine's refusal, or engine_error after timeout_s)."""
        waiter = _VoiceWaiter(self.loop)
        request = next(self.contexts)
        self.submit(waiter, [MakeVoice(request, audio, ref_text, model)])
        try:
            return await asyncio.wait_for(waiter.future, timeout_s)
        except asyncio.TimeoutError:
            raise EngineError(f"the engine did not make the voice within {timeout_s:g} s") from None
        finally:
            self._owners.pop(request, None)

    def forget(self, owner) -> None:
        """The owner is over: cancel any context it still owns (its session normally cancelled them all)."""
        left = [ctx for ctx, o in self._owners.items() if o is owner]
        if left:
            self.submit(owner, [CancelContext(ctx) for ctx in left])

    def owned(self) -> int:
        return len(self._owners)

    def behind(self) -> bool:
        """Called by the engine: on its own thread (an in-process engine), so it reads two counts only."""
        return self._outstanding + self._queued_steps >= self.max_behind

    def close(self) -> None:
        self.engine.disconnect(self.id)

    def _deliver(self, events: list) -> None:
        """The engine's deliver: on its thread (in-process engine) or on the loop (engines over IPC)."""
        if threading.get_ident() == self._loop_thread:
            self._route(events, counted=False)
            return
        with self._count_lock:
            self._outstanding += 1
        try:
            self.loop.call_soon_threadsafe(self._route, events)
        except RuntimeError:            # the loop is closed: shutting down
            pass

    def _route(self, events: list, counted: bool = True) -> None:
        """One step's events into the queues, each to its context's owner; then hand them over."""
        try:
            self._steps += 1
            batches: dict[int, tuple[object, list]] = {}
            for ev in events:
                if type(ev) is StageTimes:      # a traced context's (serve --trace-latency): reached this loop
                    ev.stamps.append(time.monotonic_ns())
                owner = self._owners.get(event_key(ev))
                if owner is not None:           # else stale: dropped (it would be at its hand-over)
                    batches.setdefault(id(owner), (owner, []))[1].append(ev)
            firsts = sorted((_first_frame(link_events), i, owner, link_events)      # i: Links never compared
                            for i, (owner, link_events) in enumerate(batches.values()))
            for first, _, owner, link_events in firsts:
                self._queue(owner, link_events, urgent=first < URGENT_FRAMES)
            self._count_queued()
        finally:
            if counted:
                with self._count_lock:
                    self._outstanding -= 1
        if self._slice_pending:
            return
        if self._outstanding:               # more steps wait on the loop: they join the queues first
            self._slice_pending = True
            self.loop.call_soon(self._route_slice)
        else:                               # at once: a loop crowded with other callbacks would delay it
            self._route_slice()

    def _queue(self, owner, events: list, urgent: bool) -> None:
        key = id(owner)
        queued = self._urgent.get(key)
        if queued is None:
            queued = self._rest.pop(key, None) if urgent else self._rest.get(key)
            if queued is None:
                queued = _Queued(owner, [], self._steps)
            (self._urgent if urgent else self._rest)[key] = queued     # a Link already in _rest keeps its place
        queued.events.extend(events)

    def _count_queued(self) -> None:
        """_queued_steps: step batches from the oldest queued entry's to the last (0: nothing queued)."""
        oldest = min((q.step for q in self._urgent.values()), default=self._steps + 1)
        if self._rest:
            oldest = min(oldest, next(iter(self._rest.values())).step)
        self._queued_steps = self._steps + 1 - oldest

    def _route_slice(self) -> None:
        """Hand the queued events to their Links, the urgent ones first, for ROUTE_SLICE_S; the rest in the next
        loop callback. A Link that raises is logged and the others go on."""
        self._slice_pending = True          # while it runs too: a step queued meanwhile only joins the queues
        t0 = time.perf_counter()
        while self._urgent or self._rest:
            _, queued = (self._urgent or self._rest).popitem(last=False)
            try:
                self._hand_over(queued.owner, join_frames(queued.events) if len(queued.events) > 1 else queued.events)
            except Exception:
                log.exception("handing engine events to %r failed", queued.owner)
            if (self._urgent or self._rest) and time.perf_counter() - t0 > ROUTE_SLICE_S:
                self._count_queued()
                self.loop.call_soon(self._route_slice)
                return
        self._queued_steps = 0
        self._slice_pending = False

    def _hand_over(self, owner, events: list) -> None:
        """Each event to `owner` while it still owns the event's context: checked event by event, since handling
        one (a fault that ends the connection) may cancel the owner's other contexts."""
        for ev in events:
            key = event_key(ev)
            if self._owners.get(key) is not owner:
                continue                    # stale: cancelled since it came
            if isinstance(ev, LAST_EVENTS):
                del self._owners[key]
            owner.engine_event(ev)


def _first_frame(events: list) -> float:
    """A Link's earliest frame among `events`. A context's first frames have the least audio ahead of its player
    (80 ms after the first), one far into its text has seconds."""
    return min((ev.first_frame for ev in events if isinstance(ev, AudioChunk)), default=math.inf)


def join_frames(events: list) -> list:
    """`events` with each context's frames that follow on (no other event of that context between them) as one
    AudioChunk, where the first of them was; other events stay in order."""
    out: list = []                      # an event, or a list: one context's chunks that follow on
    runs: dict[int, list] = {}          # context -> its run still open in `out`
    for ev in events:
        if not isinstance(ev, AudioChunk):
            runs.pop(event_key(ev), None)
            out.append(ev)
            continue
        run = runs.get(ev.context)
        if run is not None and ev.first_frame == run[-1].first_frame + run[-1].n_frames:
            run.append(ev)
        else:
            runs[ev.context] = run = [ev]
            out.append(run)
    return [_joined(r) if isinstance(r, list) else r for r in out]


def _joined(run: list[AudioChunk]) -> AudioChunk:
    if len(run) == 1:
        return run[0]
    first = run[0]
    return AudioChunk(first.context, np.concatenate([e.pcm for e in run]), first.first_frame,
                      sum(e.n_frames for e in run), first.t_emitted, first.step_s)


class _VoiceWaiter:
    """The owner of one make_voice request: its answer resolves the future."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.future = loop.create_future()

    def engine_event(self, ev) -> None:
        if self.future.done():
            return
        if isinstance(ev, VoiceMade):
            self.future.set_result(ev.voice)
        elif isinstance(ev, VoiceFailed):
            self.future.set_exception(EngineError(ev.message, ev.code))
