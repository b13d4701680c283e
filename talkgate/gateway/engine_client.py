"""The gateway's one client of the engine: commands out, each step's events routed to the Link (WebSocket
connection or HTTP stream) that owns their context, on the event loop. Every sink gets engine events
through this one path.

    client = EngineClient(engine, loop)     # engine: synth.engine.Engine, or anything with its
                                            # connect / submit / disconnect / info / new_tokenizer
    session = Session(client.info, limits, client.new_tokenizer, contexts=client.contexts)
    client.submit(link, commands)           # OpenContext makes `link` the owner of its context
    ...                                     # link.engine_events(events) on the loop, once per step
    client.forget(link)                     # the link is over: whatever it still owns is cancelled

Context ids come from one counter shared by every session of this gateway (`contexts`), so they are
unique per engine client as the engine requires. A session's MakeVoice (a context's own reference audio)
uses its context's id as request id; `make_voice` (the voice store's uploads) takes an id from the same
counter: VoiceMade and VoiceFailed are routed to their owner by it like a context's events. The engine calls `deliver` on its own thread once per
step: the batch crosses to the loop in one call_soon_threadsafe. A step's batch is handed to its Links a few at a
time, the Links at their contexts' first frames first (the least audio ahead of their players), ROUTE_SLICE_S of
them a loop callback, the next ones in the next callback: a step's audio for a worker's
hundreds of contexts (each Link encoding its own, Opus the longest) is otherwise one callback of 10-30 ms, and
every client message and timer of the loop waits behind it. Batches handed over but not yet routed to every Link
are counted: while `max_behind` are (the engine's own, or MAX_BEHIND) `behind()` is true, and the engine (its
`hold`) waits before its next step, so the loop's backlog stays bounded without dropping anything.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import threading
import time

from talkgate.synth.api import (
    AudioChunk, CancelContext, ContextDone, ContextFailed, EngineCommand, EngineError, MakeVoice, OpenContext,
    VoiceFailed, VoiceMade, VoicePrompt,
)

log = logging.getLogger("talkgate.engine_client")
MAX_BEHIND = 32             # step batches handed to the loop and not yet routed (~32 steps of audio)
ROUTE_SLICE_S = 0.002       # Links a loop callback hands their events to: until this long has passed


class EngineClient:
    def __init__(self, engine, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine, loop
        self.info = engine.info
        self.new_tokenizer = engine.new_tokenizer
        self.contexts = itertools.count(1)
        self._owners: dict[int, object] = {}           # context -> Link (touched on the loop only)
        self._outstanding = 0                          # batches handed over, not yet in _routing
        self._count_lock = threading.Lock()
        self._routing: collections.deque = collections.deque()   # (Link, its events); None ends a step's batch
        self._routed_later = 0                         # batches in _routing (loop only)
        self._slice_pending = False
        # an engine may say how far behind the loop may fall (RemoteEngines: 1, it reads the next step after)
        self.max_behind = getattr(engine, "max_behind", MAX_BEHIND)
        self._loop_thread = threading.get_ident()
        self.client = engine.connect(self._deliver)

    def submit(self, owner, commands: list[EngineCommand]) -> None:
        """On the loop: commands of `owner`'s session, in order."""
        for cmd in commands:
            if isinstance(cmd, OpenContext):
                self._owners[cmd.context] = owner
            elif isinstance(cmd, MakeVoice):
                self._owners[cmd.request] = owner
            elif isinstance(cmd, CancelContext):
                self._owners.pop(cmd.context, None)
        self.engine.submit(self.client, commands)

    async def make_voice(self, audio: bytes, ref_text: str | None, timeout_s: float) -> VoicePrompt:
        """On the loop: the engine's voice made from 24 kHz float32 mono samples; raises EngineError (the
        engine's refusal, or engine_error after timeout_s)."""
        waiter = _VoiceWaiter(self.loop)
        request = next(self.contexts)
        self.submit(waiter, [MakeVoice(request, audio, ref_text)])
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

    def capacity(self) -> int:
        """Free engine slots as last known."""
        return self.engine.stats().get("free_slots", 0)

    def behind(self) -> bool:
        return self._outstanding + self._routed_later >= self.max_behind

    def close(self) -> None:
        self.engine.disconnect(self.client)

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
        try:
            batches: dict[int, tuple[object, list]] = {}
            for ev in events:
                key = ev.request if isinstance(ev, (VoiceMade, VoiceFailed)) else ev.context
                owner = self._owners.get(key)
                if owner is None:               # cancelled meanwhile: stale
                    continue
                if isinstance(ev, (ContextDone, ContextFailed, VoiceMade, VoiceFailed)):
                    del self._owners[key]
                batches.setdefault(id(owner), (owner, []))[1].append(ev)
            self._routing.extend(sorted(batches.values(), key=_first_frame))
            self._routing.append(None)
            self._routed_later += 1
        finally:
            if counted:
                with self._count_lock:
                    self._outstanding -= 1
        if not self._slice_pending:
            self._route_slice()

    def _route_slice(self) -> None:
        """Hand events to Links in order, for ROUTE_SLICE_S; the rest in the next loop callback. A Link that
        raises is logged and the others go on."""
        self._slice_pending = True          # while it runs too: a batch routed meanwhile only joins the queue
        t0 = time.perf_counter()
        while self._routing:
            entry = self._routing.popleft()
            if entry is None:
                self._routed_later -= 1
                continue
            try:
                entry[0].engine_events(entry[1])
            except Exception:
                log.exception("handing engine events to %r failed", entry[0])
            if self._routing and time.perf_counter() - t0 > ROUTE_SLICE_S:
                self.loop.call_soon(self._route_slice)
                return
        self._slice_pending = False


def _first_frame(entry: tuple[object, list]) -> float:
    """A Link's place in a step's routing: its earliest frame. A context's first frames have the least audio
    ahead of its player (80 ms after the first), one far into its text has seconds, so those go first."""
    return min((ev.first_frame for ev in entry[1] if isinstance(ev, AudioChunk)), default=math.inf)


class _VoiceWaiter:
    """The owner of one make_voice request: its answer resolves the future."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.future = loop.create_future()

    def engine_events(self, events: list) -> None:
        for ev in events:
            if self.future.done():
                return
            if isinstance(ev, VoiceMade):
                self.future.set_result(ev.voice)
            elif isinstance(ev, VoiceFailed):
                self.future.set_exception(EngineError(ev.message, ev.code))
