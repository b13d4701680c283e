"""A message over the frame limit (4 x --max-message-bytes: 256 KiB by default) on every WebSocket endpoint of a
real `talkgate serve`, sent by the clients people use, aiohttp's and the websockets library's, whole or in
fragments and up to 16 MiB: the client reads the server's close frame with 1009, not a reset (1006), and
the server holds none of it. docs/reliability.md (WebSocket behaviour at the frame level); the frame-level cases are in
test_websocket_protocol.py."""
from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
import websockets

from tests.fuzz.endpoints import EL_SINGLE, WS_ENDPOINTS
from tests.serverproc import TalkgateServer, descendants

KIB, MIB = 1024, 1024 * 1024
SIZES = [300 * KIB, MIB, 16 * MIB]
FRAGMENT = 64 * KIB
IDS = [ep.label + ("-single" if ep is EL_SINGLE else "") for ep in WS_ENDPOINTS]


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint) as srv:     # the default limits
        yield srv


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def aiohttp_close_code(url: str, size: int) -> int | None:
    """The close code aiohttp's client reports after sending one text frame of `size` bytes (its public API
    sends no fragments)."""
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(url) as ws:
            try:
                await ws.send_str("a" * size)
            except ConnectionError:
                pass            # a reset while sending: the receive below reports it
            while (await ws.receive(timeout=30)).type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                pass            # a greeting (session.ready)
            return ws.close_code


async def websockets_close_code(url: str, size: int, fragmented: bool) -> int | None:
    """The close code the websockets library reports after sending `size` bytes, as one binary frame or as
    FRAGMENT-byte fragments of one message."""
    message = [b"a" * FRAGMENT] * (size // FRAGMENT) if fragmented else b"a" * size
    async with websockets.connect(url, max_size=None, compression=None, close_timeout=10) as ws:
        try:
            await ws.send(message)
            while True:
                await ws.recv()
        except websockets.ConnectionClosed:
            return ws.close_code


@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_aiohttp_client_reads_1009(server, ep):
    for size in SIZES:
        assert run(aiohttp_close_code(server.ws_url + ep.path(), size)) == 1009, size


@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
@pytest.mark.parametrize("fragmented", [False, True], ids=["one-frame", "fragments"])
def test_websockets_client_reads_1009(server, ep, fragmented):
    for size in SIZES:
        assert run(websockets_close_code(server.ws_url + ep.path(), size, fragmented)) == 1009, size


def peak_rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) // 1024


def test_the_server_holds_no_oversized_message(server):
    """Four 16 MiB messages, whole and in fragments: the gateway worker's peak memory grows by less than one
    of them (the message is refused at its header, or once its fragments pass the limit, and what follows
    is read and dropped)."""
    worker = next(pid for pid in descendants(server.proc.pid)
                  if b"talkgate.processes.worker" in open(f"/proc/{pid}/cmdline", "rb").read())
    before = peak_rss_mib(worker)
    for fragmented in (False, True, False, True):
        assert run(websockets_close_code(server.ws_url + WS_ENDPOINTS[0].path(), 16 * MIB, fragmented)) == 1009
    assert peak_rss_mib(worker) - before < 16, (before, peak_rss_mib(worker))
