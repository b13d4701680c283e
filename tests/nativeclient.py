"""A native-protocol WebSocket client for tests against real servers: the events it got, the audio bytes,
how its socket ended."""
from __future__ import annotations

import json

import aiohttp


class NativeClient:
    def __init__(self, ws, replica: int | None = None, timeout_s: float = 60.0):
        self.ws, self.replica, self.timeout_s, self.events, self.audio = ws, replica, timeout_s, [], 0

    async def send(self, **msg) -> None:
        await self.ws.send_str(json.dumps(msg))

    async def until(self, kind: str, timeout_s: float | None = None) -> dict | None:
        """Events up to the first of type `kind`; None when the socket ended first. 'audio': the first binary frame."""
        while True:
            msg = await self.ws.receive(timeout=timeout_s or self.timeout_s)
            if msg.type == aiohttp.WSMsgType.BINARY:
                self.audio += len(msg.data) - 16
                if kind == "audio":
                    return {}
            elif msg.type == aiohttp.WSMsgType.TEXT:
                self.events.append(json.loads(msg.data))
                if self.events[-1]["type"] == kind:
                    return self.events[-1]
            else:
                return None

    async def stream(self, cid: str, frames: int) -> None:
        """A context whose text has not ended (an LLM still streaming): in flight until finish()."""
        await self.send(type="context.start", context_id=cid, fixed_frames=frames)
        await self.send(type="text", context_id=cid, text="An LLM is still streaming this sentence ")
        assert await self.until("timing") is not None

    async def finish(self, cid: str) -> dict | None:
        await self.send(type="text", context_id=cid, text="to its end.")
        await self.send(type="flush", context_id=cid)
        return await self.until("context.done")
