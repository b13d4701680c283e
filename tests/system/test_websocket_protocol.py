"""WebSocket behaviour at the frame level (RFC 6455) on every WebSocket endpoint, checked as the Autobahn
testsuite's fuzzingclient checks a server (its case numbers in brackets), with frames built by hand
(tests/fuzz/rawws.py) against a real `talkgate serve`.

Autobahn itself cannot run here: autobahntestsuite on PyPI, 25.10.1 included, is Python 2 code and this
machine has neither Python 2 nor a Docker daemon (docs/reliability.md). Most of these behaviours are
aiohttp's; talkgate adds the close-code check and reads a failed connection to its end (server/websocket.py).
Where aiohttp decides otherwise than the RFC (unmasked client frames), the test pins what aiohttp does, as
documented in docs/reliability.md, so that the document stays true.
"""
from __future__ import annotations

import json
import socket
import struct

import aiohttp
import pytest

from tests.fuzz.endpoints import EL_SINGLE, WS_ENDPOINTS
from tests.fuzz.rawws import (
    OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, Ended, Frame, RawWebSocket, close_payload,
)
from tests.serverproc import TalkgateServer

MAX_MESSAGE_BYTES = 4096
FRAME_LIMIT = 4 * MAX_MESSAGE_BYTES       # aiohttp's max_msg_size on the server (serve_websocket)
FRAGMENT = 65536
VALID_CLOSE = [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999]       # 7.7.x
INVALID_CLOSE = [0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535]            # 7.9.x, 7.13.x
IDS = [ep.label + ("-single" if ep is EL_SINGLE else "") for ep in WS_ENDPOINTS]


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    with TalkgateServer(tiny_checkpoint, "--max-message-bytes", str(MAX_MESSAGE_BYTES)) as srv:
        yield srv


OPENED: list[RawWebSocket] = []


@pytest.fixture(autouse=True)
def close_opened():
    """Each test's sockets are closed when it ends, whatever the server did with their connections (they were
    left to the garbage collector)."""
    yield
    while OPENED:
        OPENED.pop().close()


def connect(server, ep) -> RawWebSocket:
    ws = RawWebSocket.connect(server.port, ep.path())
    OPENED.append(ws)
    if ep.greeting is not None:
        f = ws.recv_frame(10)
        assert isinstance(f, Frame) and f.opcode == OP_TEXT and ep.greeting in f.payload.decode(), f
    return ws


def answerable(ep) -> tuple[bytes, callable]:
    """A message the endpoint answers, and how to recognise the answer."""
    if ep is EL_SINGLE:
        return b'{"text": ""}', lambda t: '"isFinal":true' in t
    return ep.probe(1).encode(), lambda t: ep.answers_probe(json.loads(t), 1)


def answered(ws: RawWebSocket, matches, timeout: float = 10) -> list[Frame]:
    """Frames up to the answer; fails if the connection ends first."""
    frames = []
    while True:
        f = ws.recv_frame(timeout)
        assert isinstance(f, Frame) and f.opcode != OP_CLOSE, f"no answer, the connection ended: {f} after {frames}"
        frames.append(f)
        if f.opcode == OP_TEXT and matches(f.payload.decode()):
            return frames


def closed_with(ws: RawWebSocket, timeout: float = 10, client_ends: bool = False) -> tuple[int | None, str]:
    """The server's close frame (after any other frames), then the end of the stream: the server's own, which
    follows once the client has been quiet for server/websocket.py QUIET_S (0.5 s), or with `client_ends` at once
    after the client ends its side (as a client that closes its socket on the close frame does)."""
    frames, end = ws.frames_until_close(timeout)
    assert isinstance(end, Frame), f"no close frame: {end}; frames before: {frames}"
    if client_ends:
        ws.sock.shutdown(socket.SHUT_WR)
    after = ws.recv_frame(5)
    assert isinstance(after, Ended) and after.how in ("eof", "reset"), f"open after the close frame: {after}"
    return end.close_code, end.close_reason


# ----- close frames [7.x] -----
@pytest.mark.parametrize("code", VALID_CLOSE)
def test_valid_close_code_is_answered_normally(server, code):
    """[7.7.x] A close with a valid code: a clean close, with 1000 or the same code."""
    ws = connect(server, WS_ENDPOINTS[0])
    ws.send_close(code)
    assert closed_with(ws)[0] in (1000, code)


@pytest.mark.parametrize("code", INVALID_CLOSE)
def test_invalid_close_code_fails_the_connection_with_1002(server, code):
    """[7.9.x] Reserved or unassigned codes (1004-1006, 1015, 1016-2999, 5000 and up): 1002. aiohttp
    refuses those below 3000 but 1006; talkgate's close check refuses the rest (server/websocket.py)."""
    ws = connect(server, WS_ENDPOINTS[0])
    ws.send_frame(OP_CLOSE, struct.pack("!H", code))
    assert closed_with(ws)[0] == 1002


@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_close_rules_on_every_endpoint(server, ep):
    """[7.3.1] empty close: 1000. [7.3.2] a 1-byte close payload, [7.3.6] a reason past 123 bytes (a
    control frame over 125), [7.9.5] code 1006: 1002. [7.5.1] a reason that is not UTF-8: 1007."""
    for payload, want in ((b"", 1000), (b"\x03", 1002), (close_payload(1000, b"r" * 124), 1002),
                          (close_payload(1006), 1002), (close_payload(1000, b"\xce\xba\xed\xa0\x80"), 1007),
                          (close_payload(1000, "fine ✓".encode()), 1000)):
        ws = connect(server, ep)
        ws.send_frame(OP_CLOSE, payload)
        assert closed_with(ws)[0] == want, (payload, want)


# ----- text must be UTF-8 [6.x] -----
BAD_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82",
            "κόσμε".encode() + b"\xed\xa0\x80"]      # 0xFF, overlong, a surrogate, past U+10FFFF, cut, Autobahn 6.4


@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_invalid_utf8_text_closes_with_1007(server, ep):
    """[6.3.x, 6.x] Invalid UTF-8 (0xFF, overlong, a UTF-16 surrogate, past U+10FFFF, truncated) in a text
    message, whole or split over fragments: 1007."""
    for i, bad in enumerate(BAD_UTF8):
        ws = connect(server, ep)
        ws.send_text(b'{"text": "' + bad + b'"}')
        assert closed_with(ws, client_ends=i > 0)[0] == 1007, bad        # the server's own end once an endpoint
        ws = connect(server, ep)
        ws.send_frame(OP_TEXT, b'{"text": "a' + bad[:1], fin=False)
        ws.send_frame(OP_CONT, bad[1:] + b'"}')
        assert closed_with(ws, client_ends=True)[0] == 1007, bad


# ----- sizes [9.x, RFC 6455 7.4.1] -----
@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_oversized_messages_close_with_1009(server, ep):
    """A frame that announces more than the frame limit (4 x --max-message-bytes), a message over it sent
    whole, and one whose fragments add up past it: close 1009, cleanly (the client reads the close)."""
    ws = connect(server, ep)
    ws.send_frame(OP_TEXT, b"x" * 16, length=FRAME_LIMIT + 1)          # the header alone gives it away
    assert closed_with(ws)[0] == 1009
    ws = connect(server, ep)
    ws.send_text(b"y" * (2 * FRAME_LIMIT))
    assert closed_with(ws)[0] == 1009
    ws = connect(server, ep)
    for _ in range(3):
        ws.send_frame(OP_TEXT if _ == 0 else OP_CONT, b"z" * (FRAME_LIMIT // 2), fin=False)
    assert closed_with(ws)[0] == 1009


@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_oversized_message_larger_than_the_socket_buffers_is_read_to_the_end(server, ep):
    """[9.x] A client that writes a whole 8 MB message, one frame or FRAGMENT-byte fragments, before it reads
    anything: the server reads and drops the rest after its 1009 close frame, so the write completes and the
    client finds the close frame and then the server's FIN; no reset (server/websocket.py, LingeringClose)."""
    for fragmented in (False, True):
        ws = connect(server, ep)
        if fragmented:
            for i in range(8_000_000 // FRAGMENT):
                ws.send_frame(OP_TEXT if i == 0 else OP_CONT, b"w" * FRAGMENT, fin=False)
        else:
            ws.send_text(b"w" * 8_000_000)
        frames, end = ws.frames_until_close(10)
        assert isinstance(end, Frame) and end.close_code == 1009, (fragmented, end)
        after = ws.recv_frame(5)
        assert isinstance(after, Ended) and after.how == "eof", (fragmented, after)


def test_message_over_max_message_bytes_but_within_the_frame_limit_is_an_error_not_a_close(server):
    """Between --max-message-bytes and the frame limit the application answers: an error event, and
    the session lives on."""
    ep = WS_ENDPOINTS[0]
    ws = connect(server, ep)
    ws.send_text(json.dumps({"type": "ping", "id": "x" * (2 * MAX_MESSAGE_BYTES)}))
    f = ws.recv_frame(10)
    assert isinstance(f, Frame) and json.loads(f.payload)["code"] == "message_too_large", f
    msg, matches = answerable(ep)
    ws.send_text(msg)
    answered(ws, matches)


# ----- fragmentation [5.x] -----
@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_fragmented_messages(server, ep):
    """[5.3-5.8, 5.15-5.20] A text message in three fragments, with pings between them, is one message:
    the pings are answered at once with their payloads, the message afterwards. [5.1] A fragmented ping,
    [5.9-5.14] a continuation with no message started, [5.18] a new message before the last one ended:
    1002."""
    msg, matches = answerable(ep)
    ws = connect(server, ep)
    a, b = len(msg) // 3, 2 * len(msg) // 3
    ws.send_frame(OP_TEXT, msg[:a], fin=False)
    ws.send_frame(OP_PING, b"p1")
    ws.send_frame(OP_CONT, msg[a:b], fin=False)
    ws.send_frame(OP_PING, b"p2")
    ws.send_frame(OP_CONT, msg[b:])
    frames = answered(ws, matches)
    pongs = [f.payload for f in frames if f.opcode == OP_PONG]
    assert pongs == [b"p1", b"p2"], frames
    for frames_in in ([(OP_PING, b"x", False)], [(OP_CONT, b"x", True)], [(OP_CONT, b"x", False)],
                      [(OP_TEXT, msg[:2], False), (OP_TEXT, msg, True)],
                      [(OP_TEXT, msg[:2], False), (OP_BINARY, b"x", True)]):
        ws = connect(server, ep)
        for op, payload, fin in frames_in:
            ws.send_frame(op, payload, fin=fin)
        assert closed_with(ws)[0] == 1002, frames_in


# ----- control frames [2.x] -----
@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_ping_pong(server, ep):
    """[2.1-2.4] A ping is answered with a pong carrying its payload (empty, binary, 125 bytes);
    [2.10] ten pings, ten pongs in order; [2.6-2.7] an unsolicited pong is ignored; [2.5] a ping over
    125 bytes: 1002."""
    ws = connect(server, ep)
    for payload in (b"", bytes(range(256))[:125], "héllo".encode()):
        ws.send_frame(OP_PING, payload)
        f = ws.recv_frame(10)
        assert isinstance(f, Frame) and f.opcode == OP_PONG and f.payload == payload, f
    for i in range(10):
        ws.send_frame(OP_PING, b"n%d" % i)
    assert [ws.recv_frame(10).payload for _ in range(10)] == [b"n%d" % i for i in range(10)]
    ws.send_frame(OP_PONG, b"unsolicited")
    msg, matches = answerable(ep)
    ws.send_text(msg)
    answered(ws, matches)
    ws = connect(server, ep)
    ws.send_frame(OP_PING, b"x" * 126)
    assert closed_with(ws)[0] == 1002


# ----- reserved bits and opcodes [3.x, 4.x] -----
@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_reserved_bits_and_opcodes_fail_the_connection(server, ep):
    """[3.1-3.7] RSV1-3 set with no extension negotiated (talkgate declines permessage-deflate),
    [4.1.x, 4.2.x] reserved data and control opcodes: 1002."""
    for i, (op, rsv) in enumerate([(OP_TEXT, 1), (OP_TEXT, 2), (OP_TEXT, 4), (OP_BINARY, 7), (OP_PING, 2)] +
                                  [(op, 0) for op in (3, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF)]):
        ws = connect(server, ep)
        ws.send_frame(op, b'{"x": 1}', rsv=rsv)
        assert closed_with(ws, client_ends=i > 0)[0] == 1002, (op, rsv)     # the server's own end once an endpoint


# ----- masking [RFC 6455 5.1] -----
@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_unmasked_client_frames_are_accepted_as_aiohttp_does(server, ep):
    """RFC 6455 5.1: a server MUST close the connection on an unmasked client frame. aiohttp 3.14 does
    not check the mask bit (_websocket/reader_py.py only unmasks when it is set) and talkgate cannot see
    it: the message is served. Pinned so that docs/reliability.md stays true; if aiohttp starts to
    enforce masking, this fails and the document changes."""
    ws = connect(server, ep)
    msg, matches = answerable(ep)
    ws.send_frame(OP_TEXT, msg, mask=False)
    answered(ws, matches)


# ----- the closing handshake [7.1.x] -----
@pytest.mark.parametrize("ep", WS_ENDPOINTS, ids=IDS)
def test_closing_handshake(server, ep):
    """[7.1.1] The client's close is answered with a close, then the server ends the TCP connection;
    [7.1.3-7.1.5] frames the client sends after its close are ignored."""
    ws = connect(server, ep)
    msg, _ = answerable(ep)
    ws.send_close(1000, b"bye")
    try:                    # the server may have closed the connection already: that is allowed
        ws.send_text(msg)
        ws.send_frame(OP_PING, b"late")
    except OSError:
        pass
    frames, end = ws.frames_until_close(10)
    assert isinstance(end, Frame) and end.close_code == 1000, (frames, end)
    assert not [f for f in frames if f.opcode == OP_PONG], frames
    assert isinstance(ws.recv_frame(5), Ended)


def test_a_closed_websocket_is_freed_whatever_its_peer_sends_after_the_close():
    """aiohttp 3.14 re-arms the heartbeat (20 s, then the pong's 10 s) for every chunk a peer sends, and its
    timer holds the connection's objects: a socket the server closed while the client went on sending (its
    close frame included) must not outlive its handler. The mutation fuzz closes a few hundred a second;
    held for 30 s each, they grew a worker by tens of MB (docs/reliability.md, the release check)."""
    import asyncio
    import gc
    import weakref

    from aiohttp import web

    from talkgate.server.websocket import GatewayWebSocket

    async def go():
        held: list[weakref.ref] = []

        async def handler(request):
            ws = GatewayWebSocket(heartbeat=20.0)
            await ws.prepare(request)
            await ws.receive()
            await ws.close(code=1008, message=b"policy")     # reads the client's frames up to its close
            held.append(weakref.ref(ws))
            return ws

        app = web.Application()
        app.router.add_get("/", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as s:
                async with s.ws_connect(f"http://127.0.0.1:{port}/", autoclose=False) as ws:
                    await ws.send_str("first")
                    assert (await ws.receive(timeout=10)).type is aiohttp.WSMsgType.CLOSE
                    await ws.send_str("after the server's close")
                    await ws.close()
            for _ in range(50):
                await asyncio.sleep(0.02)
                gc.collect()
                if held and held[0]() is None:
                    break
            assert held and held[0]() is None, "the closed WebSocket is still referenced: " + ", ".join(
                type(r).__name__ for r in gc.get_referrers(held[0]()))
        finally:
            await runner.cleanup()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_server_is_unharmed(server):
    """After every frame-level violation above: healthy, and every connection released."""
    import asyncio
    import time

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.get(server.url + "/health") as r:
                assert r.status == 200
            deadline = time.monotonic() + 10
            while True:
                async with s.get(server.url + "/metrics") as r:
                    text = await r.text()
                conns = [l for l in text.splitlines() if l.startswith("talkgate_connections{") and not l.endswith(" 0.0")]
                if not conns or time.monotonic() > deadline:
                    return conns
                await asyncio.sleep(0.2)

    assert asyncio.run(go()) == []
    assert "Traceback" not in server.log()


def test_frames_written_together_parse_as_rfc_6455_frames_of_every_length():
    """Connection writes the frames queued together with one transport write (GatewayWebSocket.write_frames);
    each is an unmasked final frame, text or binary, in every length encoding (7-bit, 16-bit, 64-bit)."""
    from websockets.frames import Frame, Opcode
    from websockets.streams import StreamReader

    from talkgate.server.websocket import server_frame
    messages = ["", "é" * 70, "x" * 125, b"", b"\x01" * 125, b"\x02" * 126, b"\x03" * 65535, b"\x04" * 65536]
    reader = StreamReader()
    reader.feed_data(b"".join(part for m in messages for part in server_frame(m)))
    reader.feed_eof()
    for message in messages:
        parse = Frame.parse(reader.read_exact, mask=False)
        with pytest.raises(StopIteration) as done:
            while True:
                next(parse)
        frame = done.value.value
        assert frame.fin and not (frame.rsv1 or frame.rsv2 or frame.rsv3)
        if isinstance(message, str):
            assert frame.opcode is Opcode.TEXT and frame.data.decode() == message
        else:
            assert frame.opcode is Opcode.BINARY and frame.data == message
    assert reader.at_eof()
