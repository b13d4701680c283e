"""A connection's bounded queue of frames to write, with purge by stream (cancel drops queued audio)."""
from __future__ import annotations

import asyncio
from collections import deque


class OutboxFull(Exception):
    pass


class Outbox:
    def __init__(self, max_items: int):
        self.max_items = max_items
        self._items: deque = deque()
        self._ready = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item) -> None:
        """Never blocks: a client that does not read must not stall the engine or other sessions."""
        if self.closed:
            return
        if len(self._items) >= self.max_items:
            raise OutboxFull(f"over {self.max_items} frames waiting to be written")
        self._items.append(item)
        self._ready.set()

    def purge(self, stream: int) -> None:
        """Drop the queued frames of one stream (its context was cancelled)."""
        self._items = deque(i for i in self._items if getattr(i, "stream", None) != stream)

    def close(self) -> None:
        """No more puts; get() returns what is queued, then None."""
        self.closed = True
        self._ready.set()

    async def get(self):
        while not self._items:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()
