"""Access and HTTP cases for a server started with --api-key and --allow-origin: every documented way
to present the key is served, every missing, wrong, odd (non-ASCII) or late key is refused with the
protocol's error; browsers from other origins are refused; and the HTTP endpoints answer every client
mistake with a 4xx in one JSON shape, however the mistake is made (body, headers, method, path)."""
from __future__ import annotations

import asyncio
import gzip
import json
import socket

import aiohttp

from tests.fuzz.cases import SERVED, refused_properly
from tests.fuzz.endpoints import CARTESIA, DASHSCOPE, DEEPGRAM, DEEPGRAM_V2, EL_MULTI, EL_SINGLE, NATIVE, TWILIO
from tests.fuzz.mutate import BIG, CONTROL_TOKENS
from tests.fuzz.rawws import Ended, HandshakeRefused, RawWebSocket
from tests.fuzz.workers import HttpRequest, judge_http, send_http

KEY = "sekret"
ORIGIN = "https://app.example"
# a message that gets an answer on each endpoint once it is served
SERVE_PROBE = {NATIVE: '{"type":"ping","id":"s"}', TWILIO: '{"type":"ping","id":"s"}',
               EL_MULTI: '{"context_id":"s","close_context":true}', EL_SINGLE: '{"text":""}',
               CARTESIA: CARTESIA.probe(0), DEEPGRAM: None, DEEPGRAM_V2: DEEPGRAM_V2.probe(0),
               DASHSCOPE: DASHSCOPE.probe(0)}
SERVED_MARKS = SERVED + ('"pong"', '"type":"done"', '"type": "done"')


def served(port: int, path: str, headers=None, raw_headers: bytes = b"", first: str | None = None,
           then: str | None = None) -> str | None:
    """Is the connection served? -> None when it is, else what happened."""
    try:
        ws = RawWebSocket.connect(port, path, headers, raw_headers=raw_headers)
    except HandshakeRefused as e:
        return f"refused at the upgrade: HTTP {e.status} {e.body[:100]!r}"
    try:
        for m in (first, then):
            if m is not None:
                ws.send_text(m)
        texts = []
        for _ in range(20):
            f = ws.recv_frame(10)
            if isinstance(f, Ended):
                return f"not served: {f.how}, frames {texts[:2]}"
            if f.opcode == 8:
                return f"not served: close {f.close_code} {f.close_reason!r}, frames {texts[:2]}"
            if f.opcode == 1:
                t = f.payload.decode("utf-8", "replace")
                texts.append(t)
                if any(m in t for m in SERVED_MARKS):
                    return None
        return f"not served: {texts[:3]}"
    finally:
        ws.close()


def ws_access_cases() -> list[tuple]:
    """(what, endpoint, path, headers, raw_headers, first message, expectation: 'served' | 'refused')."""
    out = []
    right = {
        NATIVE: [("Authorization: Bearer", {"Authorization": f"Bearer {KEY}"}, None),
                 ("authorization: bearer (lower case scheme)", {"Authorization": f"bearer {KEY}"}, None),
                 ("BEARER (upper case scheme)", {"Authorization": f"BEARER {KEY}"}, None),
                 ("?api_key=", "query:api_key", None),
                 ("first message auth", {}, json.dumps({"type": "auth", "api_key": KEY}))],
        TWILIO: [("Authorization: Bearer", {"Authorization": f"Bearer {KEY}"}, None),
                 ("first message auth", {}, json.dumps({"type": "auth", "api_key": KEY}))],
        EL_MULTI: [("xi-api-key header", {"xi-api-key": KEY}, None), ("?authorization=", "query:authorization", None),
                   ("xi_api_key in the first message", {}, json.dumps({"text": " ", "context_id": "s", "xi_api_key": KEY}))],
        EL_SINGLE: [("xi-api-key header", {"xi-api-key": KEY}, None)],
        CARTESIA: [("X-API-Key header", {"X-API-Key": KEY}, None), ("?api_key=", "query:api_key", None)],
        DEEPGRAM: [("Authorization: Token", {"Authorization": f"Token {KEY}"}, None),
                   ("authorization: token (lower case scheme)", {"Authorization": f"token {KEY}"}, None)],
        # deepgram-sdk sends an API key as Token and an access token as Bearer
        DEEPGRAM_V2: [("Authorization: Token", {"Authorization": f"Token {KEY}"}, None),
                      ("authorization: token (lower case scheme)", {"Authorization": f"token {KEY}"}, None),
                      ("Authorization: Bearer (the SDK's access token)", {"Authorization": f"Bearer {KEY}"}, None)],
        DASHSCOPE: [("Authorization: Bearer", {"Authorization": f"Bearer {KEY}"}, None),
                    ("authorization: bearer (lower case scheme)", {"Authorization": f"bearer {KEY}"}, None)],
    }
    for ep, ways in right.items():
        for what, headers, first in ways:
            path = ep.path()
            if isinstance(headers, str):
                path, headers = ep.path(**{headers.split(":")[1]: KEY}), {}
            out.append((f"key by {what}", ep, path, headers, b"", first, "served"))
    for ep in (NATIVE, TWILIO, EL_MULTI, EL_SINGLE, CARTESIA, DEEPGRAM, DEEPGRAM_V2, DASHSCOPE):
        normal = SERVE_PROBE[ep]
        out.append(("no key", ep, ep.path(), {}, b"", normal, "refused"))
        out.append(("a wrong key", ep, ep.path(), {"Authorization": "Bearer nope", "xi-api-key": "nope",
                                                   "X-API-Key": "nope"}, b"", normal, "refused"))
        for raw in (b"Authorization: Bearer \xc3\xa9\xc3\xa9\r\n", b"Authorization: Bearer \xe9\r\n",
                    b"X-API-Key: \xc3\xa9\r\n", b"xi-api-key: \xff\xfe\r\n"):
            out.append((f"a non-ASCII key in a header {raw.strip()!r}", ep, ep.path(), {}, raw, normal, "refused"))
        for name in ("api_key", "authorization", "xi_api_key"):
            out.append((f"a non-ASCII key ?{name}=é", ep, ep.path(**{name: "é"}), {}, b"", normal, "refused"))
        out.append(("the right key from another origin", ep, ep.path(), _all_keys() | {"Origin": "https://evil.example"},
                    b"", normal, "refused"))
        out.append(("Origin: null", ep, ep.path(), _all_keys() | {"Origin": "null"}, b"", normal, "refused"))
        out.append(("an origin that only starts like the allowed one", ep, ep.path(),
                    _all_keys() | {"Origin": ORIGIN + ".evil.example"}, b"", normal, "refused"))
        out.append(("the right key from the allowed origin", ep, ep.path(), _all_keys() | {"Origin": ORIGIN},
                    b"", None, "served"))
    # the query is checked before the upgrade only for a valid key (its HTTP 400 names the models and voices):
    # without one the socket is refused with 1008 like every other (refused_properly's default shape is not
    # Deepgram's, so a 400 fails this)
    for query in ({"speed": "9"}, {"model": "flux-nobody-en"}):
        out.append((f"no key and a bad query {query}", DEEPGRAM_V2, DEEPGRAM_V2.path(**query), {}, b"", None,
                    "refused"))
    for ep, msg in ((NATIVE, {"type": "auth", "api_key": "é"}), (NATIVE, {"type": "auth", "api_key": "\ud800"}),
                    (NATIVE, {"type": "auth", "api_key": [KEY]}), (NATIVE, {"type": "auth", "api_key": BIG}),
                    (TWILIO, {"type": "auth", "api_key": "é"}),
                    (EL_MULTI, {"text": " ", "context_id": "s", "xi_api_key": "é"}),
                    (EL_MULTI, {"text": " ", "context_id": "s", "xi_api_key": "\ud800"}),
                    (EL_SINGLE, {"text": " ", "xi_api_key": ["é"]})):
        out.append((f"first message {json.dumps(msg)[:60]}", ep, ep.path(), {}, b"", json.dumps(msg), "refused"))
    return out


def _all_keys() -> dict:
    return {"Authorization": f"Bearer {KEY}", "xi-api-key": KEY, "X-API-Key": KEY}


def _fix_deepgram(ep, headers: dict) -> dict:
    if ep is DEEPGRAM and headers.get("Authorization", "").startswith("Bearer "):
        return {**headers, "Authorization": "Token " + headers["Authorization"][7:]}
    return headers


async def ws_access(camp, phase) -> None:
    port = camp.server.port
    for what, ep, path, headers, raw, first, expect in ws_access_cases():
        headers = _fix_deepgram(ep, headers)
        if expect == "served":
            problem = await asyncio.to_thread(served, port, path, headers, raw, first, SERVE_PROBE[ep])
            if problem:
                phase.fail("right key refused", f"{ep.name}: {what}: {problem}")
        else:
            problem = await asyncio.to_thread(refused_properly, port, path, headers, raw, first, SERVED_MARKS)
            if problem:
                phase.fail("access", f"{ep.name}: {what}: {problem}")
            else:
                phase.errors_answered += 1
        phase.counts["access cases"] += 1


def junk_then_auth(port: int, ep, junk: str, auth: str, then: str | None) -> str | None:
    """Before authenticating, a first message that is not the key must end the connection (1008):
    a key that comes after it is not accepted."""
    ws = RawWebSocket.connect(port, ep.path())
    try:
        ws.send_text(junk)
        try:
            ws.send_text(auth)
            if then:
                ws.send_text(then)
        except OSError:
            pass
        texts, end = [], None
        while end is None:
            f = ws.recv_frame(8)
            if isinstance(f, Ended) or f.opcode == 8:
                end = f
            elif f.opcode == 1:
                texts.append(f.payload.decode("utf-8", "replace"))
                if any(m in texts[-1] for m in SERVED_MARKS):
                    return f"the key after {junk!r} was accepted: {texts[:3]}"
        if isinstance(end, Ended):
            return f"still open or no close frame ({end.how}) after {junk!r}: {texts[:3]}"
        if end.close_code != 1008:
            return f"closed {end.close_code} {end.close_reason!r}, expected 1008"
        return None
    finally:
        ws.close()


async def auth_after_junk(camp, phase) -> None:
    for ep, auth, then in ((NATIVE, {"type": "auth", "api_key": KEY}, None),
                           (TWILIO, {"type": "auth", "api_key": KEY}, None),
                           (EL_MULTI, {"text": " ", "context_id": "s", "xi_api_key": KEY}, SERVE_PROBE[EL_MULTI])):
        for junk in ("{not json", "[]", '{"type":"ping"}' if ep is not EL_MULTI else '{"text":"hi"}', "\ufeff{}"):
            problem = await asyncio.to_thread(junk_then_auth, camp.server.port, ep, junk, json.dumps(auth), then)
            if problem:
                phase.fail("auth after junk", f"{ep.name}: {problem}")
            else:
                phase.errors_answered += 1


# ----- HTTP -----
def http_cases(slots: int, client_max: int) -> list[HttpRequest]:
    ok = {"input": "Hello.", "response_format": "pcm", "fixed_frames": 2}
    raw = json.dumps(ok).encode()
    out = [HttpRequest(f"lone surrogate in input ({i + 1} of {slots + 4}: more than the engine's slots)", True,
                       b'{"input": "\\ud800 hello", "response_format": "pcm", "fixed_frames": 2}')
           for i in range(slots + 4)]
    out += [HttpRequest("a valid request after them", False, raw)]
    bad = [("input = \"hello \\udfff\"", b'{"input": "hello \\udfff"}'),
           ("body nested 1000 deep", b"[" * 1000 + b"]" * 1000),
           ("input nested 1000 deep", b'{"input": ' + b"[" * 1000 + b"]" * 1000 + b"}"),
           ("body nested 100000 deep", b'{"a":' * 100000 + b"1" + b"}" * 100000),
           ("speed NaN", b'{"input": "hi", "speed": NaN}'), ("speed Infinity", b'{"input": "hi", "speed": Infinity}'),
           ("speed 1e400", b'{"input": "hi", "speed": 1e400}'),
           ("speed of 401 digits", json.dumps({"input": "hi", "speed": BIG}).encode()),
           ("seed of 401 digits", json.dumps({"input": "hi", "seed": BIG}).encode()),
           ("seed 2^64", json.dumps({"input": "hi", "seed": 2 ** 64}).encode()),
           ("fixed_frames of 401 digits", json.dumps({"input": "hi", "fixed_frames": BIG}).encode()),
           ("fixed_frames 0", json.dumps({"input": "hi", "fixed_frames": 0}).encode()),
           ("input a list", b'{"input": ["hi"]}'), ("input an object", b'{"input": {"a": 1}}'),
           ("input a number", b'{"input": 5}'), ("input null", b'{"input": null}'), ("no input", b'{"voice": "ryan"}'),
           ("input empty", b'{"input": ""}'), ("input blank", b'{"input": "   "}'),
           ("input of 4097 characters", json.dumps({"input": "x" * 4097}).encode()),
           ("voice a list", b'{"input": "hi", "voice": ["ryan"]}'), ("stream \"yes\"", b'{"input": "hi", "stream": "yes"}'),
           ("response_format \"ogg\"", b'{"input": "hi", "response_format": "ogg"}'),
           ("non_streaming_mode true", b'{"input": "hi", "non_streaming_mode": true}'),
           ("a list body", b'[{"input": "hi"}]'), ("a scalar body", b"5"), ("an empty body", b""),
           ("invalid JSON", b'{"input": "hi"'), ("invalid UTF-8", b'{"input": "\xff\xfe hi"}'),
           ("NUL in the body", b'{"input": "hi"}\x00')]
    out += [HttpRequest(w, True, b) for w, b in bad]
    out += [HttpRequest("control tokens in input", False,
                        json.dumps({**ok, "input": "Say " + " ".join(CONTROL_TOKENS) + " aloud."}).encode())]
    out += [HttpRequest("Content-Encoding gzip, body not gzip", True, raw, headers={"Content-Encoding": "gzip"}),
            HttpRequest("Content-Encoding deflate, body not deflate", True, raw, headers={"Content-Encoding": "deflate"}),
            HttpRequest("Content-Encoding br, body not brotli", True, raw, headers={"Content-Encoding": "br"}),
            HttpRequest("gzip body", False, gzip.compress(raw), headers={"Content-Encoding": "gzip"}),
            HttpRequest(f"gzip body inflating past {client_max} bytes", True,
                        gzip.compress(b'{"input": "' + b"x" * (client_max + 10) + b'"}'), headers={"Content-Encoding": "gzip"}),
            HttpRequest("charset=bogus", True, raw, headers={"Content-Type": "application/json; charset=bogus"}),
            HttpRequest("charset=utf-16 on a UTF-8 body", True, raw,
                        headers={"Content-Type": "application/json; charset=utf-16"}),
            HttpRequest(f"a body of {client_max + 1} bytes", True, raw[:-1] + b" " * client_max + b"}")]
    routes = [("GET", "/nope"), ("GET", "/v1/audio/speech"), ("PUT", "/v1/audio/speech"), ("POST", "/health"),
              ("PUT", "/metrics"), ("DELETE", "/v1/audio/voices"), ("POST", "/"), ("GET", "/web/nope.js"),
              ("GET", "/web/../server/app.py"), ("GET", "/v1/ws"), ("GET", "/v1/twilio"),
              ("GET", "/v1/twilio?stream_sid=MZ1"), ("POST", "/v1/audio/speech/"), ("GET", "/%ff"),
              ("GET", "/v1/audio/voices/x")]      # the vendors' routes: vendor_http.route_cases (their own shapes)
    out += [HttpRequest(f"{m} {p} (no such route, method or upgrade)", True, b"" if m == "GET" else raw, method=m, path=p)
            for m, p in routes]
    out += [HttpRequest(f"{m} {p}", False, b"", method=m, path=p)
            for m, p in (("GET", "/health"), ("GET", "/v1/audio/voices"), ("GET", "/"), ("HEAD", "/health"),
                         ("OPTIONS", "/v1/audio/speech"))]
    return out


def _raw_http(port: int, request: bytes) -> tuple[int, bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else -1
        return status, data
    finally:
        sock.close()


async def http_access(camp, phase, shapes: dict) -> None:
    ok = {"input": "Hello.", "response_format": "pcm", "fixed_frames": 2}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        for what, headers, path, expect in (
                ("no key", {}, "/v1/audio/speech", 401),
                ("a wrong key", {"Authorization": "Bearer nope"}, "/v1/audio/speech", 401),
                ("bearer (lower case scheme)", {"Authorization": f"bearer {KEY}"}, "/v1/audio/speech", 200),
                ("Token", {"Authorization": f"Token {KEY}"}, "/v1/audio/speech", 200),
                ("?api_key=", {}, f"/v1/audio/speech?api_key={KEY}", 200),
                ("?api_key=é", {}, "/v1/audio/speech?api_key=%C3%A9", 401),
                ("voices without a key", {}, "/v1/audio/voices", 401)):
            req = HttpRequest(what, expect >= 400, json.dumps(ok).encode(), path=path,
                              method="GET" if "voices" in path else "POST")
            status, ctype, body = await send_http(s, camp.server.url, req, headers)
            judge_http(req, status, ctype, body, phase, shapes)
            if status != expect:
                phase.fail("HTTP access", f"{what}: {status}, expected {expect}: {body[:100]!r}")
    body = json.dumps(ok).encode()
    for raw in (b"Bearer \xc3\xa9", b"Bearer \xe9", b"Bearer \xff\xfe"):
        req = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: " + raw +
               b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        status, data = await asyncio.to_thread(_raw_http, camp.server.port, req)
        head, _, rest = data.partition(b"\r\n\r\n")
        if status != 401 or b"application/json" not in head.lower():
            phase.fail("HTTP access", f"a non-ASCII key {raw!r}: {data[:160]!r}, expected 401 JSON")
        else:
            phase.errors_answered += 1
