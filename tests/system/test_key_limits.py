"""Per-key limits and usage metering against a real `talkgate serve --keys FILE --usage-log PATH` (tiny Base
checkpoint, CPU, one worker: a key's limits are exact there): each limit trips exactly at its number in every
protocol's shape (HTTP 429 with Retry-After in each API's error body; WebSocket close 1013 or the protocol's error
event), counted in /metrics by code and never by key; under a 200-session mixed load with cancels (streamed and
whole HTTP bodies) the usage log's totals equal the audio each client received within a frame a context; a SIGKILL
mid-load loses no record of a context its client saw end and counts none twice, and a restart on the same log goes
on past a line cut short."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
import time

import aiohttp
import pytest

from tests.serverproc import TalkgateServer

LIMITS = {"conn": {"connections": 2}, "ctx": {"contexts": 2}, "rpm": {"requests_per_minute": 3},
          "chars": {"characters_per_minute": 40}, "native": {}, "openai": {}, "openai_whole": {}, "cartesia": {},
          "elevenlabs": {}, "elevenlabs_whole": {}, "deepgram": {}, "broken": {}, "admin": {}}
KINDS = ("native", "native", "openai", "openai_whole", "cartesia", "elevenlabs", "elevenlabs_whole", "deepgram")
SECRET = {name: f"secret-of-{name}" for name in LIMITS}
PCM_BYTES_S = 48000         # s16le, 24 kHz, mono
FRAME_S = 0.08
SHORT = "Hello there."      # 12 characters
PCM = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
# The load's cost is the audio the engine makes: on the CPU a tiny step costs about 60 ms plus 3.6 ms a row, so its
# contexts are short (2-10 frames; a short text where the API has no fixed length) and batched up to SLOTS at once
SLOTS = 48
LOAD_TEXT = "Hi there."


def keys_text() -> str:
    return "".join(json.dumps({"id": f"{name}-key", "tenant": "t", "role": "admin" if name == "admin" else "user",
                               "sha256": hashlib.sha256(SECRET[name].encode()).hexdigest(), "limits": limits}) + "\n"
                   for name, limits in LIMITS.items())


def run(coro, timeout: float = 300):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def bearer(name: str) -> dict:
    return {"Authorization": f"Bearer {SECRET[name]}"}


def serve(checkpoint, root, *extra):
    (root / "keys.jsonl").write_text(keys_text())
    return TalkgateServer(checkpoint, "--keys", str(root / "keys.jsonl"), "--usage-log", str(root / "usage.jsonl"),
                          "--seed", "1", "--workers", "1", "--max-contexts", str(SLOTS), *extra)


@pytest.fixture(scope="module")
def server(tiny_base_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("key-limits")
    with serve(tiny_base_checkpoint, root) as srv:
        srv.root = root
        yield srv


def speech_request(api: str, text: str = SHORT, frames: int = 3) -> tuple[str, dict]:
    """(path, JSON body) of one HTTP speech request of `api` (`openai_whole`, `elevenlabs_whole`: the audio sent
    whole at the end: OpenAI's stream false, ElevenLabs' with-timestamps JSON)."""
    return {
        "openai": ("/v1/audio/speech", {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm",
                                        "fixed_frames": frames}),
        "openai_whole": ("/v1/audio/speech", {"model": "tts-1", "input": text, "voice": "alloy", "stream": False,
                                              "response_format": "pcm", "fixed_frames": frames}),
        "elevenlabs": ("/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM?output_format=pcm_24000", {"text": text}),
        "elevenlabs_whole": ("/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM/with-timestamps?output_format=pcm_24000",
                             {"text": text}),
        "cartesia": ("/tts/bytes", {"model_id": "sonic", "transcript": text, "voice": {"mode": "id", "id": "x"},
                                    "output_format": PCM}),
        "deepgram": ("/v1/speak?encoding=linear16&sample_rate=24000", {"text": text})}[api]


async def http_speech(http, url: str, api: str, key: str, text: str = SHORT, frames: int = 3) -> tuple[int, dict, bytes]:
    """One HTTP speech request of `api` -> (status, headers, body)."""
    path, body = speech_request(api, text, frames)
    async with http.post(url + path, json=body, headers=bearer(key)) as r:
        return r.status, dict(r.headers), await r.read()


def error_code(api: str, body: bytes) -> str:
    """The error code in each API's own error body."""
    b = json.loads(body)
    return {"openai": lambda: b["error"]["code"], "elevenlabs": lambda: b["detail"]["status"],
            "cartesia": lambda: b["error_code"], "deepgram": lambda: b["err_code"]}[api]()


async def native(http, ws_url: str, key: str, auth_message: bool = False):
    """A native WebSocket of `key` (header or first-message auth) -> (socket, its first message)."""
    s = await http.ws_connect(ws_url + "/v1/ws", headers={} if auth_message else bearer(key))
    if auth_message:
        await s.send_json({"type": "auth", "api_key": SECRET[key]})
    return s, await s.receive(timeout=30)


async def metrics(http, url: str) -> str:
    async with http.get(url + "/metrics") as r:
        return await r.text()


def errors(text: str, code: str) -> float:
    line = next((x for x in text.splitlines() if x.startswith(f'talkgate_errors_total{{code="{code}"}}')), None)
    return float(line.split()[-1]) if line else 0.0


def test_each_limit_trips_at_its_number_in_every_protocols_shape(server):
    url, ws_url = server.url, server.ws_url

    async def go():
        async with aiohttp.ClientSession() as http:
            # connections: 2 open (header key and first-message key), the third refused as too_many_connections is
            open_ = [await native(http, ws_url, "conn"), await native(http, ws_url, "conn", auth_message=True)]
            assert all(json.loads(m.data)["type"] == "session.ready" for _, m in open_)
            for auth_message in (False, True):
                s, m = await native(http, ws_url, "conn", auth_message)
                assert m.type == aiohttp.WSMsgType.CLOSE and s.close_code == 1013, (m, auth_message)
                await s.close()
            async with http.ws_connect(ws_url + "/tts/websocket", headers={"X-API-Key": SECRET["conn"]}) as s:
                assert (await s.receive(timeout=30)).type == aiohttp.WSMsgType.CLOSE and s.close_code == 1013
            await open_[0][0].close()           # one closes: the next opens
            s, m = await native(http, ws_url, "conn")
            assert json.loads(m.data)["type"] == "session.ready"
            for sock in (s, open_[1][0]):
                await sock.close()

            # contexts: 2 in flight on a native socket, the third refused by its error event; HTTP 429 meanwhile
            s, _ = await native(http, ws_url, "ctx")
            for cid in ("a", "b", "c"):
                await s.send_json({"type": "context.start", "context_id": cid, "fixed_frames": 400})
                await s.send_json({"type": "text", "context_id": cid, "text": "A long one."})
            refused = None
            while refused is None:
                m = await s.receive(timeout=30)
                if m.type == aiohttp.WSMsgType.TEXT and json.loads(m.data)["type"] == "error":
                    refused = json.loads(m.data)
            assert refused["code"] == "key_contexts_limit" and refused["context_id"] == "c", refused
            for api in ("openai", "elevenlabs", "cartesia", "deepgram"):
                status, headers, body = await http_speech(http, url, api, "ctx")
                assert status == 429 and headers["Retry-After"] == "1", (api, status, body)
                assert error_code(api, body) == "key_contexts_limit", (api, body)
            await s.send_json({"type": "cancel", "context_id": "a"})
            async with http.ws_connect(ws_url + "/tts/websocket", headers={"X-API-Key": SECRET["ctx"]}) as c:
                for cid in ("x", "y"):          # one slot free: x runs, y is refused in Cartesia's error shape
                    await c.send_json({"context_id": cid, "transcript": "A long one.", "continue": True,
                                       "voice": {"mode": "id", "id": "x"}, "output_format": PCM})
                while (m := await c.receive_json(timeout=30))["type"] != "error":
                    pass
                assert (m["error_code"], m["status_code"], m["context_id"]) == ("key_contexts_limit", 429, "y"), m
            await s.close()

            # requests a minute: 3 go, then every API says 429 with its Retry-After in its own shape
            for _ in range(3):
                status, _, body = await http_speech(http, url, "openai", "rpm")
                assert status == 200 and body, status
            for api in ("openai", "elevenlabs", "cartesia", "deepgram"):
                status, headers, body = await http_speech(http, url, api, "rpm")
                assert status == 429 and 1 <= int(headers["Retry-After"]) <= 60, (api, status)
                assert error_code(api, body) == "key_requests_limit", (api, body)
            s, _ = await native(http, ws_url, "rpm")
            await s.send_json({"type": "context.start", "context_id": "n", "fixed_frames": 3})
            m = await s.receive_json(timeout=30)
            assert (m["type"], m["code"]) == ("error", "key_requests_limit"), m
            await s.close()

            # characters a minute: 40 of them, exactly
            status, _, _ = await http_speech(http, url, "openai", "chars", "x" * 41)
            assert status == 429
            status, _, _ = await http_speech(http, url, "openai", "chars", "x" * 28)
            assert status == 200
            s, _ = await native(http, ws_url, "chars")
            await s.send_json({"type": "context.start", "context_id": "n", "fixed_frames": 3})
            await s.send_json({"type": "text", "context_id": "n", "text": "x" * 12})      # 40: still within
            await s.send_json({"type": "text", "context_id": "n", "text": "y"})           # 41
            while (m := await s.receive(timeout=30)).type != aiohttp.WSMsgType.TEXT or \
                    json.loads(m.data)["type"] != "error":
                pass
            assert json.loads(m.data)["code"] == "key_characters_limit", m.data
            await s.close()
            return await metrics(http, url)

    text = run(go())
    # contexts: c's start and its text (which starts it again), 4 HTTP APIs, Cartesia's y
    assert errors(text, "key_connections_limit") == 3 and errors(text, "key_contexts_limit") == 7
    assert errors(text, "key_requests_limit") == 5 and errors(text, "key_characters_limit") == 2
    assert "-key" not in text           # never a per-key label


class Tally:
    """What the clients of one key received: contexts that ended as the client sees an end (done, cancelled, a whole
    body) and their audio; contexts cut off (the server gone mid-context), the audio they got and the most the
    server could have metered for them (their length when it is fixed, else what they got and a socket's worth)."""

    def __init__(self):
        self.contexts, self.audio_s = 0, 0.0
        self.cut, self.cut_audio_s, self.cut_most_s = 0, 0.0, 0.0

    def ended(self, audio_s: float) -> None:
        self.contexts += 1
        self.audio_s += audio_s

    def cut_off(self, audio_s: float, most_s: float | None) -> None:
        self.cut += 1
        self.cut_audio_s += audio_s
        self.cut_most_s += most_s if most_s is not None else audio_s + 1.0 + 16 * FRAME_S


async def load(url: str, ws_url: str, sessions: int, seed: int, at_once: int = SLOTS - 8) -> dict[str, Tally]:
    """A mixed load over five protocols, streamed and whole HTTP bodies, a third of the native contexts cancelled
    after their first audio -> per key, what its clients received."""
    rng = random.Random(seed)
    got = {k: Tally() for k in KINDS}

    async def native(http, frames: int, cancel: bool) -> tuple[float, bool]:
        audio_s = 0.0
        async with http.ws_connect(ws_url + "/v1/ws", headers=bearer("native")) as s:
            await s.send_json({"type": "context.start", "context_id": "c", "fixed_frames": frames})
            await s.send_json({"type": "text", "context_id": "c", "text": LOAD_TEXT})
            await s.send_json({"type": "flush", "context_id": "c"})
            while True:
                m = await s.receive(timeout=60)
                if m.type == aiohttp.WSMsgType.BINARY:
                    audio_s += (len(m.data) - 16) / PCM_BYTES_S
                    if cancel:
                        cancel = False
                        await s.send_json({"type": "cancel", "context_id": "c"})
                elif m.type != aiohttp.WSMsgType.TEXT:
                    return audio_s, False           # the socket ended without the context's end
                elif json.loads(m.data)["type"] in ("context.done", "context.cancelled", "error"):
                    return audio_s, True

    async def cartesia(http) -> tuple[float, bool]:
        audio_s = 0.0
        async with http.ws_connect(ws_url + "/tts/websocket", headers={"X-API-Key": SECRET["cartesia"]}) as s:
            await s.send_json({"context_id": "k", "transcript": LOAD_TEXT, "continue": False,
                               "voice": {"mode": "id", "id": "x"}, "output_format": PCM})
            while (m := await s.receive(timeout=60)).type == aiohttp.WSMsgType.TEXT:
                event = json.loads(m.data)
                if event["type"] == "chunk":
                    audio_s += len(base64.b64decode(event["data"])) / PCM_BYTES_S
                elif event["type"] in ("done", "error"):
                    return audio_s, True
            return audio_s, False

    async def http_body(http, kind: str, frames: int) -> tuple[float, bool]:
        path, body = speech_request(kind, LOAD_TEXT, frames)
        data = b""
        try:
            async with http.post(url + path, json=body, headers=bearer(kind)) as r:
                async for chunk in r.content.iter_any():
                    data += chunk
                assert r.status == 200, data
        except aiohttp.ClientError:
            return len(data) / PCM_BYTES_S, False
        if kind == "elevenlabs_whole":
            return len(base64.b64decode(json.loads(data)["audio_base64"])) / PCM_BYTES_S, True
        return len(data) / PCM_BYTES_S, True

    async def one(http, n: int) -> None:
        kind = KINDS[n % len(KINDS)]
        frames = rng.randint(2, 10)
        most = frames * FRAME_S
        try:
            if kind == "native":
                audio_s, ended = await native(http, frames, cancel=n % 3 == 0)
            elif kind == "cartesia":
                audio_s, ended = await cartesia(http)
                most = None
            else:
                audio_s, ended = await http_body(http, kind, frames)
        except (aiohttp.ClientError, ConnectionError):
            audio_s, ended = 0.0, False     # refused at its connect: the server is gone (the context never began)
            most = 0.0
        if ended:
            got[kind].ended(audio_s)
        else:
            got[kind].cut_off(audio_s, most)

    slots = asyncio.Semaphore(at_once)       # within the engine's context slots

    async def held(http, n: int) -> None:
        async with slots:
            await one(http, n)

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(held(http, n) for n in range(sessions)))
    return got


def usage_records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def usage(url: str) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/v1/usage?start=0", headers=bearer("admin")) as r:
            assert r.status == 200
            return await r.json()


def test_usage_totals_equal_the_audio_clients_received(server):
    t = time.monotonic()
    got = run(load(server.url, server.ws_url, 200, 7))
    took = time.monotonic() - t

    async def totals():
        async with aiohttp.ClientSession() as http:
            async with http.get(server.url + "/v1/usage", headers=bearer("native")) as r:
                assert r.status == 403
        await asyncio.sleep(0.5)            # the last records are written as their connections end
        return await usage(server.url)
    body = run(totals())
    by_key = {t["key_id"]: t for t in body["totals"]}
    for kind, client in got.items():
        total = by_key[f"{kind}-key"]
        assert client.cut == 0 and total["contexts"] == client.contexts, (kind, total, vars(client))
        assert abs(total["audio_s"] - client.audio_s) <= FRAME_S * client.contexts, (kind, total, vars(client))
        assert total["audio_s"] > 0 and total["characters"] > 0
    assert sum(c.contexts for c in got.values()) == 200
    records = usage_records(server.root / "usage.jsonl")
    assert len({r["id"] for r in records}) == len(records)
    assert took < 60, f"200 sessions took {took:.1f} s"


def test_a_broken_off_http_response_counts_what_was_sent(server):
    """A client that leaves a whole-body request while its audio is made: its record says the text and 0 audio
    seconds; one that leaves a streamed response after its first audio: at least what it got, at most a socket's
    worth more (what the server handed to the socket before it saw the client gone)."""
    log_path = server.root / "usage.jsonl"

    def broken() -> list[dict]:
        return [r for r in usage_records(log_path) if r["key_id"] == "broken-key"]

    async def go() -> float:
        async with aiohttp.ClientSession() as http:
            path, body = speech_request("openai_whole", LOAD_TEXT, 400)        # 32 s: it runs until the client goes
            task = asyncio.ensure_future(http.post(server.url + path, json=body, headers=bearer("broken")))
            await asyncio.sleep(1.0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            deadline = time.monotonic() + 15
            while len(broken()) < 1:
                assert time.monotonic() < deadline, "no record of the whole-body request the client left"
                await asyncio.sleep(0.05)
            path, body = speech_request("openai", LOAD_TEXT, 400)
            async with http.post(server.url + path, json=body, headers=bearer("broken")) as r:
                assert r.status == 200
                got = len(await r.content.readany())
                r.close()                   # gone, the rest unread
            while len(broken()) < 2:
                assert time.monotonic() < deadline + 15, "no record of the streamed request the client left"
                await asyncio.sleep(0.05)
            return got / PCM_BYTES_S
    got_s = run(go())
    whole, streamed = broken()
    assert (whole["api"], whole["characters"], whole["audio_s"]) == ("openai", len(LOAD_TEXT), 0), whole
    assert 0 < got_s <= streamed["audio_s"] <= got_s + 1.0 + FRAME_S, (got_s, streamed)
    assert streamed["audio_s"] < 400 * FRAME_S / 4          # it ended when the client left, not at its length


def test_sigkill_mid_load_loses_no_usage_record_and_counts_none_twice(tiny_base_checkpoint, tmp_path):
    """SIGKILL of the whole server mid-load (supervisor, worker and engine at once): every context whose end its client
    saw has its record (a record is written before the bytes that end its context leave), none is there twice, and
    what the records count is what the clients got (cut-off contexts: at most what the server could have metered).
    Then a line cut short is put at the log's end (what a host crash or a full disk can leave; a SIGKILL cannot
    cut a write) and the server starts again on the same log: its records start on a line of their own, and
    GET /v1/usage is the records before the kill plus the new load's, the cut line skipped."""
    log_path = tmp_path / "usage.jsonl"
    with serve(tiny_base_checkpoint, tmp_path) as srv:
        async def go():
            task = asyncio.ensure_future(load(srv.url, srv.ws_url, 64, 3))
            while not log_path.exists() or len(usage_records(log_path)) < 16:
                await asyncio.sleep(0.01)
            srv.kill()
            return await task
        before = run(go())
    lines = log_path.read_text().split("\n")
    assert lines[-1] == ""                  # ends with a whole line
    records = [json.loads(line) for line in lines[:-1]]
    assert len(records) >= 16 and len({r["id"] for r in records}) == len(records)
    assert sum(t.cut for t in before.values()) > 0, "the kill came after the load: it proves nothing"
    for kind, client in before.items():
        mine = [r for r in records if r["key_id"] == f"{kind}-key"]
        audio_s = sum(r["audio_s"] for r in mine)
        # none lost: every context its client saw end is there; none twice: no more than the contexts begun
        assert client.contexts <= len(mine) <= client.contexts + client.cut, (kind, len(mine), vars(client))
        assert client.audio_s - FRAME_S * client.contexts <= audio_s, (kind, audio_s, vars(client))
        assert audio_s <= client.audio_s + client.cut_most_s + FRAME_S * (client.contexts + client.cut), \
            (kind, audio_s, vars(client))

    with open(log_path, "ab") as f:         # a line cut short
        f.write(b'{"id":"0badc0de","key_id":"native-key","tenant":"t","model"')
    with serve(tiny_base_checkpoint, tmp_path) as srv:
        after = run(load(srv.url, srv.ws_url, 16, 4))
        body = run(usage(srv.url))
    assert body["skipped"] == 1, body
    by_key = {t["key_id"]: t for t in body["totals"]}
    for kind, client in after.items():
        mine = [r for r in records if r["key_id"] == f"{kind}-key"]
        total = by_key[f"{kind}-key"]
        assert client.cut == 0 and total["contexts"] == len(mine) + client.contexts, (kind, total, len(mine))
        assert abs(total["audio_s"] - sum(r["audio_s"] for r in mine) - client.audio_s) <= \
            FRAME_S * client.contexts + 0.01, (kind, total, vars(client))
