"""Engine events -> wire actions, on one thread between the engine and the event loop.

Turning an audio chunk into frames (session bookkeeping, resampling, Opus encoding) is the gateway's
largest per-frame cost: at 256 streams it saturated the event loop (measured: docs/benchmarks.md).
Here it runs on its own thread, where libopus and soxr release the GIL, and each batch of results
reaches the loop in one call_soon_threadsafe instead of one per chunk. The engine only appends to a
queue (never blocks); a connection serializes its protocol object with its own lock.

Bounded without dropping anything: events are counted from the engine's put until the loop has applied
their actions, and while MAX_BACKLOG are outstanding `behind()` is true, which holds the engine before
its next step (the server sets `Engine.hold`). One step adds at most one event per context, so the
backlog never exceeds MAX_BACKLOG plus one step's events.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading

log = logging.getLogger("talkgate.pump")
MAX_BATCH = 4096
MAX_BACKLOG = 8192          # events: about 32 steps of 256 contexts, 2.5 s of their audio


class EventPump:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._outstanding = 0                    # put and not yet applied on the loop
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="talkgate-pump", daemon=True)
        self._thread.start()

    def put(self, connection, event) -> None:
        """Called on the engine thread: never blocks."""
        self._count(1)
        self._events.put((connection, event))

    def backlog(self) -> int:
        """Events put and not yet applied on the event loop."""
        return self._outstanding

    def behind(self) -> bool:
        """True while MAX_BACKLOG events are outstanding: the engine should wait before its next step."""
        return self._outstanding >= MAX_BACKLOG

    def stop(self) -> None:
        self._events.put(None)
        self._thread.join(timeout=5)

    def _count(self, n: int) -> None:
        with self._count_lock:
            self._outstanding += n

    def _run(self) -> None:
        while (item := self._events.get()) is not None:
            batch = [item]
            while len(batch) < MAX_BATCH:
                try:
                    item = self._events.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._events.put(None)       # stop after this batch
                    break
                batch.append(item)
            out = [(conn, conn.engine_event(ev)) for conn, ev in batch]   # never raises (Connection)
            try:
                self.loop.call_soon_threadsafe(self._deliver, out)
            except RuntimeError:                 # the loop is closed: shutting down
                return

    def _deliver(self, out) -> None:
        try:
            for conn, actions in out:
                if actions:
                    conn.apply(actions)
        finally:
            self._count(-len(out))

