"""`talkgate serve --colocate` (issue 46): the engines of several models in one engine process, stepped by one loop
(ipc/engine_group.py), on the CPU with tiny CustomVoice and VoiceDesign checkpoints. Each model answers its own
requests with its own audio; two models' contexts stream together on one socket (each engine's audio goes out while
the other's step runs: Engine.beside_turn); the process killed fails both models' contexts and is started again."""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from talkgate.synth.checkpoint import create_checkpoint
from tests.nativeclient import NativeClient
from tests.serverproc import TalkgateServer, descendants
from tests.system.test_models import context_ends

TEXT = "Hello there, my friend."


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    vd = create_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-voice_design", preset="tiny",
                           variant="voice_design", seed=0)
    with TalkgateServer(f"cv={tiny_checkpoint}", "--model", f"vd={vd}", "--workers", "1", "--colocate",
                        "--seed", "7") as srv:
        yield srv


def engine_processes(server) -> list[int]:
    return [pid for pid in descendants(server.proc.pid)
            if b"talkgate.processes.engine_process" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]


async def speak(url: str, **body) -> tuple[int, bytes]:
    body = {"input": TEXT, "response_format": "pcm", "seed": 7, **body}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/audio/speech", json=body) as r:
            return r.status, await r.read()


def test_two_models_in_one_engine_process_each_speak_their_own(server):
    assert len(engine_processes(server)) == 1

    async def main():
        return (await speak(server.url, model="cv", voice="ryan"), await speak(server.url, model="cv", voice="ryan"),
                await speak(server.url, model="vd", instructions="a calm, low voice"))

    (s1, cv), (s2, cv_again), (s3, vd) = asyncio.run(main())
    assert (s1, s2, s3) == (200, 200, 200)
    assert len(cv) > 0 and cv == cv_again            # one model, one seed: the same audio
    assert cv != vd                                  # the other model's weights speak


def test_two_models_stream_together_on_one_connection(server):
    async def main():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{server.ws_url}/v1/ws") as ws:
                c = NativeClient(ws)
                assert await c.until("session.ready") is not None
                await c.send(type="context.start", context_id="a", model="cv", voice="ryan", fixed_frames=40)
                await c.send(type="context.start", context_id="b", model="vd", instructions="bright", fixed_frames=40)
                for cid in ("a", "b"):
                    await c.send(type="text", context_id=cid, text="Two models speak on one socket.")
                    await c.send(type="flush", context_id=cid)
                return [await c.until("context.done"), await c.until("context.done")]

    done = asyncio.run(main())
    assert sorted(d["context_id"] for d in done) == ["a", "b"]
    assert all(d["reason"] != "failed" and d["audio_ms"] == 40 * 80 for d in done)


def test_the_process_killed_fails_both_models_contexts_and_comes_back(server):
    """Last in this module: the killed process is restarted by the supervisor."""
    (pid,) = engine_processes(server)

    async def main():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{server.ws_url}/v1/ws") as ws:
                c = NativeClient(ws)
                assert await c.until("session.ready") is not None
                for cid, model in (("cv", {"model": "cv", "voice": "ryan"}),
                                   ("vd", {"model": "vd", "instructions": "x"})):
                    await c.send(type="context.start", context_id=cid, fixed_frames=400, **model)
                    await c.send(type="text", context_id=cid, text="Both of these are on the process that is killed.")
                await c.until("timing")
                os.kill(pid, signal.SIGKILL)
                return await context_ends(c, 2)

    ends = asyncio.run(main())
    assert {cid: (ev["type"], ev.get("code")) for cid, ev in ends.items()} == {
        "cv": ("error", "engine_failed"), "vd": ("error", "engine_failed")}

    async def again():
        for _ in range(300):                         # the supervisor starts it again (a tiny model: seconds)
            status, body = await speak(server.url, model="vd", instructions="a calm, low voice")
            if status == 200:
                return status, body, await speak(server.url, model="cv", voice="ryan")
            await asyncio.sleep(0.2)
        raise AssertionError(f"not served again: {status} {body[:200]!r}")

    status, body, (cv_status, cv) = asyncio.run(again())
    assert status == 200 and len(body) > 0 and cv_status == 200 and len(cv) > 0
    assert engine_processes(server) != [pid] and len(engine_processes(server)) == 1
