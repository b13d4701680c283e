"""The real client libraries, unmodified, against a real `talkgate serve` (tiny checkpoint, CPU):
pipecat's ElevenLabs / Cartesia / Deepgram TTS services in a pipeline (WebSocket and HTTP), and LiveKit's
plugins (streamed over WebSocket, and synthesize() over HTTP).

Random weights seldom sample eos (now and then a turn ends early): a context mostly ends at the
engine's frame budget for its text length, so the texts are short, and assertions bound a turn's
length instead of fixing it. For each client: a streamed turn gives audio of the asked format and the
client sees the turn end; an interruption stops that turn's audio and the next turn is clean.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re

import aiohttp
import pytest

from tests.serverproc import TalkgateServer

API_KEY = "test-key"
TURN_TIMEOUT_S = 90
BYE_NOW_BUDGET_S = 50 * 0.08 + 0.1      # engine budget_min frames for a text this short, + MP3 framing


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    # every client's own default voice id onto the model's default voice
    voice_map = tmp_path_factory.mktemp("compat") / "voices.json"
    voice_map.write_text(json.dumps({api: {"*": None} for api in ("elevenlabs", "cartesia", "deepgram")}))
    # --seed: the client libraries send no seed, and the tiny model's random weights sample the end of speech
    # at a random frame (about 1 utterance in 60 within its first 15 frames): seeded, a turn that is meant to
    # be interrupted runs the same way every time
    with TalkgateServer(tiny_checkpoint, "--voice-map", str(voice_map), "--api-key", API_KEY, "--seed", "1") as srv:
        yield srv


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 3 * TURN_TIMEOUT_S))


async def cancelled_contexts(url: str) -> float:
    """Contexts the server has cancelled so far (its /metrics)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
        m = re.search(r'talkgate_contexts_finished_total\{reason="cancelled"\} ([\d.e+]+)', await r.text())
    return float(m.group(1)) if m else 0.0


# ----- pipecat -----
class Pipecat:
    """A pipeline [tts, sink]; the sink records what the TTS service pushes downstream."""

    def __init__(self, tts):
        from pipecat.frames.frames import TTSAudioRawFrame, TTSStoppedFrame, TTSTextFrame
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineParams, PipelineWorker
        from pipecat.processors.frame_processor import FrameProcessor

        self.frames: list = []
        self.stopped = asyncio.Event()
        harness = self

        class Sink(FrameProcessor):
            async def process_frame(self, frame, direction):
                await super().process_frame(frame, direction)
                if isinstance(frame, (TTSAudioRawFrame, TTSTextFrame, TTSStoppedFrame)):
                    harness.frames.append(frame)
                    if isinstance(frame, TTSStoppedFrame):
                        harness.stopped.set()
                await self.push_frame(frame, direction)

        self.worker = PipelineWorker(Pipeline([tts, Sink()]), cancel_on_idle_timeout=False,
                                     params=PipelineParams(audio_out_sample_rate=16000))
        self.started = asyncio.Event()

        @self.worker.event_handler("on_pipeline_started")
        async def _started(worker, frame):
            self.started.set()

    async def __aenter__(self):
        from pipecat.workers.runner import WorkerRunner

        self.runner = WorkerRunner()
        await self.runner.add_workers(self.worker)
        self.task = asyncio.create_task(self.runner.run())
        await asyncio.wait_for(self.started.wait(), 30)
        return self

    async def __aexit__(self, *exc):
        from pipecat.frames.frames import EndFrame

        await self.worker.queue_frame(EndFrame())
        await asyncio.wait_for(self.task, 30)

    async def say(self, *chunks: str) -> None:
        from pipecat.frames.frames import LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame

        self.stopped.clear()
        await self.worker.queue_frames([LLMFullResponseStartFrame(), *map(LLMTextFrame, chunks),
                                        LLMFullResponseEndFrame()])

    async def first_audio(self) -> None:
        from pipecat.frames.frames import TTSAudioRawFrame

        while not any(isinstance(f, TTSAudioRawFrame) for f in self.frames):
            await asyncio.sleep(0.02)

    async def interrupt(self) -> None:
        from pipecat.frames.frames import InterruptionWorkerFrame

        await self.worker.queue_frame(InterruptionWorkerFrame())

    def take(self) -> tuple[bytes, str, list]:
        """(audio, transcript, frames) received so far; forget them."""
        from pipecat.frames.frames import TTSAudioRawFrame, TTSTextFrame

        frames, self.frames = self.frames, []
        audio = [f for f in frames if isinstance(f, TTSAudioRawFrame)]
        assert all(f.sample_rate == 16000 and f.num_channels == 1 for f in audio)
        text = " ".join(f.text.strip() for f in frames if isinstance(f, TTSTextFrame))
        return b"".join(f.audio for f in audio), text, frames


def pipecat_services(url: str):
    from pipecat.services.cartesia.tts import CartesiaTTSService
    from pipecat.services.deepgram.tts import DeepgramTTSService
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

    ws = url.replace("http://", "ws://")
    return {
        "elevenlabs": lambda: ElevenLabsTTSService(api_key=API_KEY, url=ws,
                                                   settings=ElevenLabsTTSService.Settings(voice="any-voice")),
        "cartesia": lambda: CartesiaTTSService(api_key=API_KEY, url=f"{ws}/tts/websocket",
                                               settings=CartesiaTTSService.Settings(voice="any-voice")),
        "deepgram": lambda: DeepgramTTSService(api_key=API_KEY, base_url=ws),
    }


async def pipecat_turn_and_interruption(url: str, name: str) -> None:
    async with Pipecat(pipecat_services(url)[name]()) as p:
        await p.say("Hello there. ", "How are you? ")
        await asyncio.wait_for(p.stopped.wait(), TURN_TIMEOUT_S)
        audio, text, _ = p.take()
        assert len(audio) >= 2 * 1280 and len(audio) % 2 == 0        # s16le at 16 kHz, >= one 80 ms frame
        if name != "deepgram":      # word timings come from our alignment / timestamps
            assert text.split() == ["Hello", "there.", "How", "are", "you?"], text

        cancelled = await cancelled_contexts(url)
        interrupted = ("This turn is interrupted before it ends. It goes on and on, so that it is still being "
                       "spoken when the caller barges in. ")
        await p.say(interrupted)
        await asyncio.wait_for(p.first_audio(), TURN_TIMEOUT_S)
        await p.interrupt()
        await asyncio.sleep(0.5)
        _, text, _ = p.take()
        if name != "deepgram":      # the transcript kept is what the alignment says was spoken: a strict prefix
            words = text.split()
            assert words == interrupted.split()[:len(words)] and len(words) < len(interrupted.split()), text
        await asyncio.sleep(1.0)
        stale, _, _ = p.take()
        assert stale == b"", "audio of the interrupted turn kept coming"
        if name != "elevenlabs":    # pipecat cancels (Cartesia) / clears (Deepgram); ElevenLabs lets a flushed context finish
            assert await cancelled_contexts(url) > cancelled, "the server did not stop the interrupted turn"

        await p.say("Bye now. ")
        await asyncio.wait_for(p.stopped.wait(), TURN_TIMEOUT_S)
        audio, text, _ = p.take()
        assert audio
        if name != "deepgram":
            assert text.split() == ["Bye", "now."], text


@pytest.mark.parametrize("name", ["elevenlabs", "cartesia", "deepgram"])
def test_pipecat(server, name):
    run(pipecat_turn_and_interruption(server.url, name))


def pipecat_http_service(url: str, name: str, http: aiohttp.ClientSession):
    from pipecat.services.cartesia.tts import CartesiaHttpTTSService
    from pipecat.services.deepgram.tts import DeepgramHttpTTSService
    from pipecat.services.elevenlabs.tts import ElevenLabsHttpTTSService

    if name == "elevenlabs":        # POST /v1/text-to-speech/{voice}/stream/with-timestamps
        return ElevenLabsHttpTTSService(api_key=API_KEY, base_url=url, aiohttp_session=http,
                                        settings=ElevenLabsHttpTTSService.Settings(voice="any-voice"))
    if name == "cartesia":          # POST /tts/bytes
        return CartesiaHttpTTSService(api_key=API_KEY, base_url=url, aiohttp_session=http,
                                      settings=CartesiaHttpTTSService.Settings(voice="any-voice"))
    return DeepgramHttpTTSService(api_key=API_KEY, base_url=url, aiohttp_session=http)     # POST /v1/speak


async def pipecat_http_turns(url: str, name: str) -> None:
    async with aiohttp.ClientSession() as http, Pipecat(pipecat_http_service(url, name, http)) as p:
        for chunks, words in ((("Hello there. ", "How are you? "), ["Hello", "there.", "How", "are", "you?"]),
                              (("Bye now. ",), ["Bye", "now."])):
            await p.say(*chunks)
            await asyncio.wait_for(p.stopped.wait(), TURN_TIMEOUT_S)
            audio, text, _ = p.take()
            assert len(audio) >= 2 * 1280 and len(audio) % 2 == 0        # s16le at 16 kHz, >= one 80 ms frame
            if name == "elevenlabs":    # word timings from the with-timestamps alignment
                assert text.split() == words, text


@pytest.mark.parametrize("name", ["elevenlabs", "cartesia", "deepgram"])
def test_pipecat_http(server, name):
    run(pipecat_http_turns(server.url, name))


# ----- LiveKit -----
def livekit_tts(url: str, name: str, http: aiohttp.ClientSession):
    from livekit.plugins import cartesia, deepgram, elevenlabs

    if name == "elevenlabs":
        return elevenlabs.TTS(api_key=API_KEY, base_url=f"{url}/v1", encoding="pcm_24000", http_session=http)
    if name == "elevenlabs-mp3":       # the plugin's default encoding, decoded by the plugin
        return elevenlabs.TTS(api_key=API_KEY, base_url=f"{url}/v1", http_session=http)
    if name == "elevenlabs-opus":      # Ogg Opus, decoded by the plugin
        return elevenlabs.TTS(api_key=API_KEY, base_url=f"{url}/v1", encoding="opus_48000_64", http_session=http)
    if name == "cartesia":
        return cartesia.TTS(api_key=API_KEY, base_url=url, http_session=http)
    return deepgram.TTS(api_key=API_KEY, base_url=f"{url}/v1/speak", http_session=http)


async def livekit_stream(tts, text: str, interrupt_after: int | None = None) -> tuple[int, float, int]:
    """Push `text` into a stream, end input, read it: (audio frames, seconds of audio, sample rate)."""
    frames, seconds, rate = 0, 0.0, 0
    async with tts.stream() as stream:
        for word in text.split(" "):
            stream.push_text(word + " ")
        stream.end_input()
        async for ev in stream:
            frames += 1
            seconds += ev.frame.samples_per_channel / ev.frame.sample_rate
            rate = ev.frame.sample_rate
            if interrupt_after is not None and frames >= interrupt_after:
                break       # leaving the stream closes it: the plugin drops or cancels the context
    return frames, seconds, rate


async def livekit_turns(url: str, name: str) -> None:
    async with aiohttp.ClientSession() as http:
        tts = livekit_tts(url, name, http)
        try:
            frames, seconds, rate = await asyncio.wait_for(livekit_stream(tts, "Hello there, how are you?"),
                                                           TURN_TIMEOUT_S)
            assert frames and seconds >= 0.08 and rate == tts.sample_rate
            _, clean, _ = await asyncio.wait_for(livekit_stream(tts, "Bye now."), TURN_TIMEOUT_S)
            await asyncio.wait_for(livekit_stream(tts, "This one is cut off early by the caller, who has "
                                                  "something to say.", 1), TURN_TIMEOUT_S)
            # the same text after the interruption: at most its own audio (the engine's frame budget for
            # it, 50 frames = 4 s; less when a random model samples eos), nothing of the interrupted turn
            frames, seconds, _ = await asyncio.wait_for(livekit_stream(tts, "Bye now."), TURN_TIMEOUT_S)
            assert frames and clean >= 0.08 and 0.08 <= seconds <= BYE_NOW_BUDGET_S, (seconds, clean)
        finally:
            await tts.aclose()


@pytest.mark.parametrize("name", ["elevenlabs", "elevenlabs-mp3", "elevenlabs-opus", "cartesia", "deepgram"])
def test_livekit(server, name):
    run(livekit_turns(server.url, name))


async def livekit_synthesize(url: str, name: str) -> None:
    """The plugins' non-streaming path, tts.synthesize(text): one HTTP request (ElevenLabs
    /v1/text-to-speech/{voice}/stream, Cartesia /tts/bytes, Deepgram POST /v1/speak)."""
    async with aiohttp.ClientSession() as http:
        tts = livekit_tts(url, name, http)
        try:
            seconds, rate = 0.0, 0
            async for ev in tts.synthesize("Hello there, how are you?"):
                seconds += ev.frame.samples_per_channel / ev.frame.sample_rate
                rate = ev.frame.sample_rate
            assert seconds >= 0.08 and rate == tts.sample_rate
        finally:
            await tts.aclose()


@pytest.mark.parametrize("name", ["elevenlabs", "elevenlabs-mp3", "cartesia", "deepgram"])
def test_livekit_http(server, name):
    run(asyncio.wait_for(livekit_synthesize(server.url, name), TURN_TIMEOUT_S))


# ----- Twilio mode (a bridge is plain WebSocket code: no client library) -----
async def twilio_bridge_turn(url: str) -> None:
    ws_url = url.replace("http://", "ws://")
    async with aiohttp.ClientSession() as http, \
            http.ws_connect(f"{ws_url}/v1/twilio?stream_sid=MZ42", headers={"Authorization": f"Bearer {API_KEY}"}) as ws:
        assert (await ws.receive_json())["type"] == "session.ready"
        await ws.send_json({"type": "text", "context_id": "t1", "text": "Hello caller."})
        await ws.send_json({"type": "flush", "context_id": "t1"})
        media, order = 0, []
        while True:
            msg = await ws.receive(timeout=TURN_TIMEOUT_S)
            assert msg.type == aiohttp.WSMsgType.TEXT        # Twilio takes no binary frames
            m = json.loads(msg.data)
            order.append(m.get("event") or m["type"])
            if m.get("event") == "media":
                assert m["streamSid"] == "MZ42" and len(base64.b64decode(m["media"]["payload"])) == 160
                media += 1
            elif m.get("event") == "mark":
                assert m == {"event": "mark", "streamSid": "MZ42", "mark": {"name": "t1"}}
            elif m.get("type") == "context.done":
                break
        assert media and order.index("mark") == len(order) - 2


def test_twilio_mode(server):
    run(twilio_bridge_turn(server.url))


# ----- ElevenLabs inactivity_timeout (per socket) -----
async def elevenlabs_inactivity(url: str) -> float:
    ws_url = url.replace("http://", "ws://")
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as http, http.ws_connect(
            f"{ws_url}/v1/text-to-speech/v/multi-stream-input?output_format=pcm_16000&inactivity_timeout=1",
            headers={"xi-api-key": API_KEY}) as ws:
        start = loop.time()
        await asyncio.sleep(0.7)
        await ws.send_json({"text": ""})            # pipecat's keepalive resets the clock
        err = await ws.receive_json(timeout=10)
        assert err["error"] == "input_timeout_exceeded" and err["code"] == 1008
        assert (await ws.receive(timeout=10)).type == aiohttp.WSMsgType.CLOSE and ws.close_code == 1008
        return loop.time() - start


def test_elevenlabs_inactivity_timeout(server):
    assert 1.6 <= run(elevenlabs_inactivity(server.url)) < 5


# ----- each API's own way of presenting a key -----
async def refused_and_accepted(url: str) -> None:
    ws_url = url.replace("http://", "ws://")
    el = f"{ws_url}/v1/text-to-speech/v/multi-stream-input?output_format=pcm_16000"
    async with aiohttp.ClientSession() as http:
        for target, kw in ((f"{ws_url}/tts/websocket", {"headers": {"X-API-Key": "wrong"}}),
                           (f"{ws_url}/v1/speak", {"headers": {"Authorization": "Token wrong"}})):
            async with http.ws_connect(target, **kw) as ws:
                assert (await ws.receive(timeout=10)).type == aiohttp.WSMsgType.CLOSE and ws.close_code == 1008
        async with http.ws_connect(f"{ws_url}/tts/websocket?api_key={API_KEY}&cartesia_version=2025-04-16") as ws:
            await ws.send_json({"context_id": "c", "cancel": True})      # accepted: nothing to answer
            await ws.send_str("{")
            assert (await ws.receive_json(timeout=10))["error_code"] == "invalid_json"
        async with http.ws_connect(el) as ws:                            # key in the first message
            await ws.send_json({"text": " ", "context_id": "c", "xi_api_key": "wrong"})
            assert (await ws.receive_json(timeout=10))["error"] == "invalid_api_key"
            assert (await ws.receive(timeout=10)).type == aiohttp.WSMsgType.CLOSE and ws.close_code == 1008
        async with http.ws_connect(f"{el}&authorization={API_KEY}") as ws:
            await ws.send_json({"text": "Hi. ", "context_id": "c", "flush": True})
            await ws.send_json({"context_id": "c", "close_context": True})
            while not (msg := await ws.receive_json(timeout=TURN_TIMEOUT_S)).get("isFinal"):
                assert msg.get("audio") is not None or msg.get("alignment")


def test_api_keys(server):
    run(refused_and_accepted(server.url))
