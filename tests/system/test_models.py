"""Several models in one `talkgate serve` (issue 46): tiny CustomVoice, Base and VoiceDesign checkpoints, each with
its own engine process, routed per request by model name or by voice; one model's engine killed leaves the
others' streams intact. Which model spoke is told by the audio: the same text and seed give the same audio on one
checkpoint and different audio on another (random weights of their own)."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from pathlib import Path

import aiohttp
import httpx
import pytest

from talkgate.synth.checkpoint import create_checkpoint
from tests.nativeclient import NativeClient
from tests.serverproc import TalkgateServer, descendants
from tests.voicetools import AUTH, KEY, audio_file, upload


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tiny_base_checkpoint, tmp_path_factory):
    vd = create_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-voice_design", preset="tiny",
                           variant="voice_design", seed=0)
    # a second Base checkpoint: its own speaker encoder and speech tokenizer (other random weights, same size)
    base2 = create_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-base-2", preset="tiny", variant="base", seed=1)
    store = tmp_path_factory.mktemp("voice-store")
    # --seed: a request that sets none (Cartesia has no seed) is as reproducible as the seeded ones (speak's 7)
    with TalkgateServer(f"cv={tiny_checkpoint}", "--model", f"base={tiny_base_checkpoint}", "--model", f"vd={vd}",
                        "--model", f"base2={base2}", "--workers", "1", "--api-key", KEY, "--voice-store", str(store),
                        "--seed", "7") as srv:
        srv.checkpoints = {"cv": str(tiny_checkpoint), "base": str(tiny_base_checkpoint), "vd": str(vd),
                           "base2": str(base2)}
        yield srv


TEXT = "Hello there, my friend."


async def speak(url: str, **body) -> tuple[int, bytes]:
    body = {"input": TEXT, "response_format": "pcm", "seed": 7, **body}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/audio/speech", json=body, headers=AUTH) as r:
            return r.status, await r.read()


def test_openai_model_routes_each_request_to_its_model(server):
    async def main():
        cv = await speak(server.url, model="cv", voice="ryan")
        cv_by_voice = await speak(server.url, voice="ryan")            # a CustomVoice speaker: the CustomVoice model
        vd = await speak(server.url, model="vd", instructions="a calm, low voice")
        vd_by_instructions = await speak(server.url, instructions="a calm, low voice")     # alone: VoiceDesign
        base = await speak(server.url, model="base")
        alias = await speak(server.url, model="tts-1", voice="ryan")    # a vendor's name: the default (cv)
        unknown = await speak(server.url, model="no-such-model", voice="ryan")
        return cv, cv_by_voice, vd, vd_by_instructions, base, alias, unknown

    cv, cv_by_voice, vd, vd_by_instructions, base, alias, unknown = asyncio.run(main())
    for status, audio in (cv, vd, base):
        assert status == 200 and len(audio) > 0
    assert cv_by_voice == cv and alias == cv
    assert vd_by_instructions == vd
    assert len({cv[1], vd[1], base[1]}) == 3             # three checkpoints, three different audios
    assert unknown[0] == 400 and b"unknown_model" in unknown[1] and b"cv, base, vd, base2" in unknown[1]


def test_vendor_sdks_select_a_model_by_name(server):
    """ElevenLabs' and Cartesia's SDKs, unmodified, name a served model in their own model_id (HTTP and Cartesia's
    WebSocket): the audio is that model's, as OpenAI's `model` gives it; their own model names are the default's."""
    import cartesia
    from cartesia import Cartesia
    from elevenlabs.client import ElevenLabs
    from elevenlabs.core.api_error import ApiError

    (_, base), (_, cv) = asyncio.run(speak(server.url, model="base")), asyncio.run(speak(server.url, voice="ryan"))
    pcm = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
    with httpx.Client(timeout=60) as http:
        tts = ElevenLabs(api_key=KEY, base_url=server.url, httpx_client=http).text_to_speech
        el = {model: b"".join(tts.convert("ryan", text=TEXT, model_id=model, output_format="pcm_24000", seed=7))
              for model in ("base", "eleven_flash_v2_5")}
        with pytest.raises(ApiError) as el_unknown:
            b"".join(tts.convert("ryan", text=TEXT, model_id="no-such-model"))
        c = Cartesia(api_key=KEY, base_url=server.url, websocket_base_url=server.ws_url, http_client=http)
        c_http = {model: c.tts.generate(model_id=model, transcript=TEXT, voice="ryan", output_format=pcm).read()
                  for model in ("base", "sonic-3")}
        with pytest.raises(cartesia.BadRequestError) as c_unknown:
            c.tts.generate(model_id="no-such-model", transcript=TEXT, voice="ryan", output_format=pcm)
        with c.tts.websocket_connect() as conn:
            ctx = conn.context(model_id="base", voice="ryan", output_format=pcm)
            ctx.push(TEXT)
            ctx.no_more_inputs()
            c_socket = b"".join(base64.b64decode(e.data) for e in ctx.receive() if e.type == "chunk")

    assert base != cv
    assert el["base"] == base and el["eleven_flash_v2_5"] == cv
    assert c_http["base"] == base and c_http["sonic-3"] == cv and c_socket == base
    assert el_unknown.value.status_code == 400 and el_unknown.value.body["detail"]["status"] == "unknown_model"
    assert c_unknown.value.body["error_code"] == "unknown_model"


def test_ready_and_listing_per_model(server):
    async def main():
        async with aiohttp.ClientSession() as http:
            out = {}
            for query in ("", "?model=base", "?model=nope"):
                async with http.get(f"{server.url}/ready{query}") as r:
                    out[query] = (r.status, await r.json())
            async with http.get(f"{server.url}/v1/models", headers=AUTH) as r:
                out["models"] = (r.status, await r.json())
            return out

    out = asyncio.run(main())
    assert out[""][0] == 200 and out[""][1]["model"]["model_type"] == "custom_voice"
    assert out["?model=base"][0] == 200 and out["?model=base"][1]["model"]["model_type"] == "base"
    assert out["?model=nope"][0] == 404
    status, listing = out["models"]
    assert status == 200
    served = {m["model_id"]: m for m in listing if m["model_id"] in ("cv", "base", "vd")}
    assert {k: m["talkgate_model_type"] for k, m in served.items()} == {
        "cv": "custom_voice", "base": "base", "vd": "voice_design"}
    assert "ryan" in served["cv"]["talkgate_voices"] and served["base"]["talkgate_voices"] == []


def test_cloned_voice_goes_to_the_base_model(server):
    async def main():
        async with aiohttp.ClientSession() as http:
            status, made = await upload(http, server.url, "Jo", audio_file(2.0))
        assert status in (200, 201), made
        by_voice = await speak(server.url, voice=made["id"])
        by_model = await speak(server.url, model="base", voice=made["id"])
        on_cv = await speak(server.url, model="cv", voice=made["id"])
        return by_voice, by_model, on_cv

    by_voice, by_model, on_cv = asyncio.run(main())
    assert by_voice[0] == 200 and by_voice == by_model
    assert on_cv[0] == 400 and b"invalid_voice" in on_cv[1]


def test_a_cloned_voice_is_spoken_only_by_the_base_checkpoint_that_made_it(server):
    """A voice prompt's x-vector is its maker's speaker encoder's (ModelInfo.speaks): a voice made by base2 (the
    upload's `model`) goes to base2 when the request names no model, and is refused on base, in words."""
    async def main():
        async with aiohttp.ClientSession() as http:
            status, made = await upload(http, server.url, "Kim", audio_file(2.0), model="base2")
            assert status in (200, 201), made
            async with http.get(f"{server.url}/v1/audio/voices?model=base", headers=AUTH) as r:
                on_base = [v["id"] for v in (await r.json())["voices"]]
            async with http.get(f"{server.url}/v1/audio/voices?model=base2", headers=AUTH) as r:
                on_base2 = [v["id"] for v in (await r.json())["voices"]]
        return (made, on_base, on_base2, await speak(server.url, voice=made["id"]),
                await speak(server.url, model="base2", voice=made["id"]), await speak(server.url, model="base", voice=made["id"]))

    made, on_base, on_base2, by_voice, by_model, refused = asyncio.run(main())
    assert made["id"] in on_base2 and made["id"] not in on_base
    assert by_voice[0] == 200 and by_voice == by_model
    assert refused[0] == 400 and b"invalid_voice" in refused[1] and b"valid only on the checkpoint" in refused[1]


def test_two_models_on_one_connection(server):
    async def main():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{server.ws_url}/v1/ws", headers=AUTH) as ws:
                c = NativeClient(ws)
                assert await c.until("session.ready") is not None
                await c.send(type="context.start", context_id="a", model="cv", voice="ryan")
                await c.send(type="context.start", context_id="b", model="vd", instructions="a bright voice")
                for cid in ("a", "b"):
                    await c.send(type="text", context_id=cid, text="Two models speak on one socket.")
                    await c.send(type="flush", context_id=cid)
                done = [await c.until("context.done"), await c.until("context.done")]
                await c.send(type="context.start", context_id="c", model="nope")
                error = await c.until("error")
                return done, error

    done, error = asyncio.run(main())
    assert sorted(d["context_id"] for d in done) == ["a", "b"]
    assert all(d["reason"] != "failed" and d["audio_ms"] > 0 for d in done)
    assert error["code"] == "unknown_model"


def engine_pid(server, model: str) -> int:
    checkpoint = server.checkpoints[model]
    for pid in descendants(server.proc.pid):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"talkgate.processes.engine_process" in argv and checkpoint.encode() in argv:
            return pid
    raise AssertionError(f"no engine process of {model}")


def test_one_models_engine_killed_leaves_the_others_streaming(server):
    """Last in this module: the killed engine is restarted by the supervisor."""
    async def main():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{server.ws_url}/v1/ws", headers=AUTH) as ws:
                c = NativeClient(ws)
                assert await c.until("session.ready") is not None
                await c.send(type="context.start", context_id="cv", model="cv", voice="ryan", fixed_frames=60)
                await c.send(type="text", context_id="cv", text="This stream keeps going while another dies.")
                await c.send(type="context.start", context_id="vd", model="vd", instructions="x", fixed_frames=400)
                await c.send(type="text", context_id="vd", text="This one is on the engine that is killed.")
                await c.until("timing")
                os.kill(engine_pid(server, "vd"), signal.SIGKILL)
                await c.send(type="flush", context_id="cv")
                return await context_ends(c, 2)

    ends = asyncio.run(main())
    assert ends["cv"]["type"] == "context.done" and ends["cv"]["audio_ms"] > 0
    assert ends["vd"]["type"] == "error" and ends["vd"]["code"] == "engine_failed"


async def context_ends(client: NativeClient, n: int) -> dict:
    """The ends (context.done or error) of `n` contexts, by context id."""
    ends = {}
    while len(ends) < n:
        ev = await until_any(client, ("context.done", "error"))
        ends[ev["context_id"]] = ev
    return ends


async def until_any(client: NativeClient, kinds: tuple[str, ...]) -> dict:
    """The next event of a context whose type is one of `kinds` (audio frames counted on the way)."""
    while True:
        msg = await client.ws.receive(timeout=client.timeout_s)
        if msg.type == aiohttp.WSMsgType.TEXT:
            ev = json.loads(msg.data)
            client.events.append(ev)
            if ev["type"] in kinds and ev.get("context_id") is not None:
                return ev
        elif msg.type != aiohttp.WSMsgType.BINARY:
            raise AssertionError(f"the socket ended: {client.events[-5:]}")


def test_a_models_file_names_aliases_and_slots(tiny_checkpoint, tiny_base_checkpoint, tmp_path):
    """`serve --models FILE`: each line a model with its name, aliases (a vendor's model name among them, which then
    names that model instead of the default) and its engines' slots."""
    models = tmp_path / "models.jsonl"
    models.write_text(f"# the default first\n"
                      f'{{"name": "cv", "path": "{tiny_checkpoint}"}}\n\n'
                      f'{{"name": "base", "path": "{tiny_base_checkpoint}", "aliases": ["tts-1", "clone"], '
                      f'"max_contexts": 3}}\n')

    async def main(url):
        async with aiohttp.ClientSession() as http:
            slots = {}
            for model in ("cv", "base"):
                async with http.get(f"{url}/ready?model={model}") as r:
                    slots[model] = (await r.json())["slots"]
        return (slots, await speak(url, model="base"), await speak(url, model="tts-1"), await speak(url, model="clone"),
                await speak(url, model="gpt-4o-mini-tts", voice="ryan"), await speak(url, voice="ryan"))

    with TalkgateServer(None, "--models", str(models), "--workers", "1", "--api-key", KEY) as srv:
        slots, base, tts1, clone, vendor, cv = asyncio.run(main(srv.url))
    assert slots == {"cv": 16, "base": 3}                   # the CPU's default for cv, the file's for base
    assert base[0] == 200 and tts1 == base and clone == base
    assert vendor[0] == 200 and vendor == cv and cv != base

