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
unique per engine client as the engine requires. The engine calls `deliver` on its own thread once per
step: the batch crosses to the loop in one call_soon_threadsafe. Batches handed over but not yet routed
are counted: while MAX_BEHIND are outstanding `behind()` is true, and the engine (its `hold`) waits
before its next step, so the loop's backlog stays bounded without dropping anything.
"""
from __future__ import annotations

import asyncio
import itertools
import threading

from talkgate.synth.api import CancelContext, ContextDone, ContextFailed, EngineCommand, OpenContext

MAX_BEHIND = 32             # step batches handed to the loop and not yet routed (~32 steps of audio)


class EngineClient:
    def __init__(self, engine, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine, loop
        self.info = engine.info
        self.new_tokenizer = engine.new_tokenizer
        self.contexts = itertools.count(1)
        self._owners: dict[int, object] = {}           # context -> Link (touched on the loop only)
        self._outstanding = 0
        self._count_lock = threading.Lock()
        self._loop_thread = threading.get_ident()
        self.client = engine.connect(self._deliver)

    def submit(self, owner, commands: list[EngineCommand]) -> None:
        """On the loop: commands of `owner`'s session, in order."""
        for cmd in commands:
            if isinstance(cmd, OpenContext):
                self._owners[cmd.context] = owner
            elif isinstance(cmd, CancelContext):
                self._owners.pop(cmd.context, None)
        self.engine.submit(self.client, commands)

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
        return self._outstanding >= MAX_BEHIND

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
                owner = self._owners.get(ev.context)
                if owner is None:               # cancelled meanwhile: stale
                    continue
                if isinstance(ev, (ContextDone, ContextFailed)):
                    del self._owners[ev.context]
                batches.setdefault(id(owner), (owner, []))[1].append(ev)
            for owner, evs in batches.values():
                owner.engine_events(evs)
        finally:
            if counted:
                with self._count_lock:
                    self._outstanding -= 1
