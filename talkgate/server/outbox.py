"""A connection's bounded queue of frames to write, with purge by stream (cancel drops queued audio)."""
from __future__ import annotations

import asyncio
from collections import deque


class OutboxFull(Exception):
    pass


def _size(item) -> int:
    data = getattr(item, "data", b"")
    return len(data) if isinstance(data, (bytes, str)) else 0


class Outbox:
    def __init__(self, max_items: int, max_bytes: int):
        self.max_items, self.max_bytes = max_items, max_bytes
        self._items: deque = deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item) -> None:
        """Never blocks: a client that does not read must not stall the engine or other sessions."""
        if self.closed:
            return
        size = _size(item)
        if len(self._items) >= self.max_items or self._bytes + size > self.max_bytes:
            raise OutboxFull(f"over {self.max_items} frames or {self.max_bytes} bytes waiting to be written")
        self._items.append(item)
        self._bytes += size
        self._ready.set()

    def purge(self, stream: int) -> list:
        """Drop the queued frames of one stream (its context was cancelled) -> them."""
        dropped = [i for i in self._items if getattr(i, "stream", None) == stream]
        if dropped:
            self._items = deque(i for i in self._items if getattr(i, "stream", None) != stream)
            self._bytes = sum(map(_size, self._items))
        return dropped

    def clear(self) -> list:
        """Drop every queued frame -> them."""
        dropped = list(self._items)
        self._items.clear()
        self._bytes = 0
        return dropped

    def close(self) -> None:
        """No more puts; get() returns what is queued, then None."""
        self.closed = True
        self._ready.set()

    def take_ready(self, limit: int) -> list:
        """Up to `limit` queued frames, without waiting (those queued behind the one get() returned)."""
        items = [self._items.popleft() for _ in range(min(limit, len(self._items)))]
        self._bytes -= sum(map(_size, items))
        return items

    async def get(self):
        while not self._items:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        self._bytes -= _size(item)
        return item
