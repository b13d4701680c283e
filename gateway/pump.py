"""Engine events -> wire actions, on one thread between the engine and the event loop.

Turning an audio chunk into frames (session bookkeeping, resampling, Opus encoding) is the gateway's
largest per-frame cost: at 256 streams it saturated the event loop (measured: docs/benchmarks.md).
Here it runs on its own thread, where libopus and soxr release the GIL, and each batch of results
reaches the loop in one call_soon_threadsafe instead of one per chunk. The engine only appends to a
queue (never blocks); a connection serializes its protocol object with its own lock.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading

log = logging.getLogger("talkgate.pump")
MAX_BATCH = 4096


class EventPump:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="talkgate-pump", daemon=True)
        self._thread.start()

    def put(self, connection, event) -> None:
        """Called on the engine thread: never blocks."""
        self._events.put((connection, event))

    def stop(self) -> None:
        self._events.put(None)
        self._thread.join(timeout=5)

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
            out = [(conn, conn.engine_event(ev)) for conn, ev in batch]
            try:
                self.loop.call_soon_threadsafe(_deliver, out)
            except RuntimeError:                 # the loop is closed: shutting down
                return


def _deliver(out) -> None:
    for conn, actions in out:
        if actions:
            conn.apply(actions)
