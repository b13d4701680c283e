"""The clone endpoints through the official client libraries, unmodified (elevenlabs and cartesia Python SDKs),
and the returned voice ids spoken by pipecat's and LiveKit's TTS services, against a real `talkgate serve`
(tiny Base checkpoint, CPU). A cloned voice must change the audio: each service's turn with the id is
compared with the same turn in the model's default voice (the server is seeded, so only the voice differs)."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.system.test_compat_clients import Pipecat, livekit_stream
from tests.voicetools import AUTH, KEY, audio_file

TURN_TIMEOUT_S = 90


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 4 * TURN_TIMEOUT_S))


# The SDK clients are closed with the module, and the connections they keep alive with them (left to the garbage
# collector otherwise). ElevenLabs' has no close of its own: it is given an HTTP client with its default timeout.
@pytest.fixture(scope="module")
def elevenlabs_client(base_server):
    import httpx
    from elevenlabs import ElevenLabs

    with httpx.Client(timeout=240) as http:
        yield ElevenLabs(api_key=KEY, base_url=base_server.url, httpx_client=http)


@pytest.fixture(scope="module")
def cartesia_client(base_server):
    from cartesia import Cartesia

    with Cartesia(api_key=KEY, base_url=base_server.url) as client:
        yield client


@pytest.fixture(scope="module")
def cloned(elevenlabs_client, cartesia_client):
    """A voice cloned through each SDK: {"elevenlabs": id, "cartesia": id}."""
    el = elevenlabs_client.voices.ivc.create(
        name="SDK ElevenLabs", files=[("a.wav", audio_file(1.5, 50), "audio/wav"),
                                      ("b.mp3", audio_file(1.5, 51, fmt="MP3", subtype="MPEG_LAYER_III"), "audio/mpeg")],
        description="two samples", labels={"language": "en", "accent": "neutral"})
    ca = cartesia_client.voices.clone(clip=("c.wav", audio_file(2.0, 52, 16000), "audio/wav"), name="SDK Cartesia",
                                      language="en", description="one clip")
    return {"elevenlabs": el.voice_id, "cartesia": ca.id, "el_response": el, "ca_response": ca}


def test_elevenlabs_sdk_clones_lists_gets_deletes(elevenlabs_client, cloned):
    c = elevenlabs_client
    assert cloned["el_response"].requires_verification is False
    voice_id = cloned["elevenlabs"]
    listed = c.voices.get_all()
    mine = next(v for v in listed.voices if v.voice_id == voice_id)
    assert mine.name == "SDK ElevenLabs" and mine.category == "cloned" and mine.labels == {"language": "en", "accent": "neutral"}
    assert mine.description == "two samples"
    found = c.voices.search(search="sdk eleven", page_size=5)
    assert [v.voice_id for v in found.voices] == [voice_id] and found.has_more is False and found.total_count == 1
    first = c.voices.search(page_size=1)
    assert len(first.voices) == 1 and first.has_more and first.next_page_token
    assert c.voices.get(voice_id).name == "SDK ElevenLabs"
    temp = c.voices.ivc.create(name="SDK temporary", files=[("t.wav", audio_file(1.2, 53), "audio/wav")])
    assert c.voices.delete(temp.voice_id).status == "ok"
    from elevenlabs.core.api_error import ApiError
    with pytest.raises(ApiError) as e:
        c.voices.get(temp.voice_id)
    assert e.value.status_code == 404 and e.value.body["detail"]["status"] == "voice_not_found"
    with pytest.raises(ApiError) as e:          # the same name again: refused, nothing stored
        c.voices.ivc.create(name="sdk elevenlabs", files=[("t.wav", audio_file(1.2, 54), "audio/wav")])
    assert e.value.status_code == 400 and e.value.body["detail"]["status"] == "voice_exists"


def test_cartesia_sdk_clones_lists_gets_deletes(cartesia_client, cloned):
    c = cartesia_client
    made = cloned["ca_response"]
    assert made.name == "SDK Cartesia" and made.language == "en" and made.description == "one clip"
    voice_id = cloned["cartesia"]
    listed = list(c.voices.list(limit=2))            # pages of 2, through the SDK's cursor (starting_after)
    assert voice_id in [v.id for v in listed] and len({v.id for v in listed}) == len(listed)
    got = c.voices.get(voice_id)
    assert got.name == "SDK Cartesia" and got.is_owner and got.locales[0].locale == "en"
    temp = c.voices.clone(clip=("t.wav", audio_file(1.2, 55), "audio/wav"), name="Cartesia temporary", language="en")
    c.voices.delete(temp.id)
    import cartesia
    with pytest.raises(cartesia.NotFoundError):
        c.voices.get(temp.id)
    with pytest.raises(cartesia.BadRequestError, match="silent"):
        c.voices.clone(clip=("s.wav", audio_file(1.5)[:44] + bytes(72000), "audio/wav"), name="Silent", language="en")


def pipecat_service(url: str, name: str, voice: str):
    from pipecat.services.cartesia.tts import CartesiaTTSService
    from pipecat.services.deepgram.tts import DeepgramTTSService
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

    ws = url.replace("http://", "ws://")
    if name == "elevenlabs":
        return ElevenLabsTTSService(api_key=KEY, url=ws, settings=ElevenLabsTTSService.Settings(voice=voice))
    if name == "cartesia":
        return CartesiaTTSService(api_key=KEY, url=f"{ws}/tts/websocket", settings=CartesiaTTSService.Settings(voice=voice))
    return DeepgramTTSService(api_key=KEY, base_url=ws, settings=DeepgramTTSService.Settings(voice=voice))


async def pipecat_turn(url: str, name: str, voice: str) -> bytes:
    async with Pipecat(pipecat_service(url, name, voice)) as p:
        await p.say("Hello there. ", "How are you? ")
        await asyncio.wait_for(p.stopped.wait(), TURN_TIMEOUT_S)
        audio, _, _ = p.take()
    return audio


def differ(a: bytes, b: bytes) -> bool:
    n = min(len(a), len(b))
    return n > 0 and a[:n] != b[:n]


@pytest.mark.parametrize("name", ["elevenlabs", "cartesia", "deepgram"])
def test_pipecat_speaks_the_returned_id(base_server, cloned, name):
    voice = cloned["cartesia" if name == "cartesia" else "elevenlabs"]
    mine = run(pipecat_turn(base_server.url, name, voice))
    default = run(pipecat_turn(base_server.url, name, "not-a-stored-voice"))     # a Base model's default voice
    assert len(mine) >= 2 * 1280 and differ(mine, default)


def livekit_tts(url: str, name: str, voice: str, http):
    from livekit.plugins import cartesia, deepgram, elevenlabs

    if name == "elevenlabs":
        return elevenlabs.TTS(api_key=KEY, base_url=f"{url}/v1", voice_id=voice, encoding="pcm_24000", http_session=http)
    if name == "cartesia":
        return cartesia.TTS(api_key=KEY, base_url=url, voice=voice, http_session=http)
    return deepgram.TTS(api_key=KEY, base_url=f"{url}/v1/speak", model=voice, http_session=http)


async def livekit_turn(url: str, name: str, voice: str) -> tuple[int, float]:
    async with aiohttp.ClientSession() as http:
        tts = livekit_tts(url, name, voice, http)
        try:
            frames, seconds, _ = await asyncio.wait_for(livekit_stream(tts, "Hello there, how are you?"), TURN_TIMEOUT_S)
        finally:
            await tts.aclose()
    return frames, seconds


async def native_failure(url: str, voice: str) -> dict:
    async with aiohttp.ClientSession() as http, http.ws_connect(url.replace("http", "ws") + "/v1/ws", headers=AUTH) as ws:
        await ws.receive_json()
        await ws.send_json({"type": "context.start", "context_id": "x", "voice": voice})
        return await ws.receive_json(timeout=30)


@pytest.mark.parametrize("name", ["elevenlabs", "cartesia", "deepgram"])
def test_livekit_speaks_the_returned_id(base_server, cloned, name):
    voice = cloned["cartesia" if name == "cartesia" else "elevenlabs"]
    frames, seconds = run(livekit_turn(base_server.url, name, voice))
    assert frames and seconds >= 0.08
    # the id resolved to the stored voice (an id of that form that the store lacks is refused, not defaulted)
    assert run(native_failure(base_server.url, voice[:-1] + ("0" if voice[-1] != "0" else "1")))["code"] == "unknown_voice"
