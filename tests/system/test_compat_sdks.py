"""The vendors' official Python SDKs, unmodified (openai, elevenlabs, cartesia, deepgram-sdk, dashscope: versions
pinned in the test extra), against one real `talkgate serve` over TLS (a self-signed certificate made here: https://
and wss:// on the same port), every HTTP and WebSocket call of docs/compat.md. Each SDK is pointed at
talkgate as docs/compat.md shows; it trusts the certificate through its own HTTP client option
(`http_client` / `httpx_client`) or, for the SDKs' WebSocket helpers, SSL_CERT_FILE (Python's default
certificate store, which the `websockets` library uses). The key goes in each SDK's own header.

The tiny checkpoint's contexts end by the untrained text-length rule: short texts, exact frame counts.
"""
from __future__ import annotations

import base64
import io
import json
import re
import ssl
import time

import httpx
import pytest

from talkgate.synth.request import frames_for_text
from tests.serverproc import TalkgateServer
from tests.tlscert import self_signed

KEY = "sdk-key"
TEXT = "Hello there."
FRAMES = frames_for_text(TEXT)          # 9 frames of 80 ms: 1920 samples each at 24 kHz


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(tiny_checkpoint, cert):
    with TalkgateServer(tiny_checkpoint, "--api-key", KEY, "--ssl-certfile", str(cert[0]), "--ssl-keyfile",
                        str(cert[1])) as srv:
        assert srv.url.startswith("https://") and srv.ws_url.startswith("wss://")
        yield srv


@pytest.fixture
def tls(cert, monkeypatch):
    """An SSL context trusting the test certificate, and SSL_CERT_FILE for the SDKs' WebSocket helpers."""
    monkeypatch.setenv("SSL_CERT_FILE", str(cert[0]))
    return ssl.create_default_context(cafile=str(cert[0]))


@pytest.fixture
def http(tls):
    """The HTTP client the SDKs are given (it trusts the certificate), closed after the test with the connections
    it keeps alive: the SDKs' own clients are never closed here, and what they held was left to the collector."""
    with httpx.Client(verify=tls, timeout=60) as client:
        yield client


def pcm_frames(audio: bytes, rate: int) -> float:
    """80 ms frames in s16le audio at `rate`."""
    return len(audio) / 2 / (rate * 0.08)


def mp3_close(data: bytes, samples: int) -> bool:
    """A streamed MP3 decodes to the audio's samples plus at most 3 frames: the info frame left empty (one
    frame of silence), the encoder's delay and the last frame's padding."""
    return 0 <= decoded_samples(data, "mp3") - samples <= 3 * 1152


def decoded_samples(data: bytes, fmt: str | None = None) -> int:
    import av
    with av.open(io.BytesIO(data), format=fmt) as c:
        return sum(f.samples for f in c.decode(audio=0))


def contexts_active(url: str, tls: ssl.SSLContext) -> float:
    text = httpx.get(f"{url}/metrics", verify=tls).text
    return float(re.search(r"^talkgate_contexts_active (\S+)", text, re.M).group(1))


# ----- OpenAI -----
def test_openai_speech(server, tls, http, tokenizer):
    import openai
    client = openai.OpenAI(api_key=KEY, base_url=f"{server.url}/v1", http_client=http)
    speech = client.audio.speech

    # the body streams by default: the first bytes arrive while the context is still generating
    with speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="alloy", input=TEXT,
                                               response_format="pcm", extra_body={"fixed_frames": 400}) as r:
        assert r.headers["content-type"] == "audio/pcm" and r.headers.get("transfer-encoding") == "chunked"
        chunks = r.iter_bytes()
        first = next(chunks)
        assert first and contexts_active(server.url, tls) == 1.0
        rest = b"".join(chunks)
    assert len(first + rest) == 400 * 1920 * 2

    for fmt, container in (("mp3", "mp3"), ("aac", "aac"), ("opus", "ogg"), ("flac", "flac"), ("wav", "wav")):
        with speech.with_streaming_response.create(model="tts-1", voice="nova", input=TEXT, response_format=fmt) as r:
            data = r.read()
        # within the encoders' priming and block padding of the exact length
        assert 0 <= decoded_samples(data, container) * 24000 / (48000 if fmt == "opus" else 24000) - FRAMES * 1920 \
            <= 2048 + 1152, fmt

    # stream_format="sse": OpenAI's events, its usage
    with speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice={"id": "ryan"}, input=TEXT,
                                               response_format="pcm", stream_format="sse") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(audio) == FRAMES * 1920 * 2
    tokens = len(tokenizer.encode(TEXT))
    assert events[-1] == {"type": "speech.audio.done",
                          "usage": {"input_tokens": tokens, "output_tokens": FRAMES, "total_tokens": tokens + FRAMES}}

    # the whole file at once: speech.create (the SDK reads the streamed body to its end)
    wav = speech.create(model="tts-1", voice="shimmer", input=TEXT, response_format="wav").read()
    assert wav[:4] == b"RIFF" and len(wav) == 44 + FRAMES * 1920 * 2

    with pytest.raises(openai.BadRequestError) as e:
        speech.create(model="tts-1", voice="nobody", input=TEXT)
    assert e.value.status_code == 400 and e.value.body["code"] == "unknown_voice"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(api_key="wrong", base_url=f"{server.url}/v1",
                      http_client=http).audio.speech.create(model="tts-1", voice="alloy", input="x")


# ----- ElevenLabs -----
def elevenlabs_client(server, http, key=KEY):
    from elevenlabs.client import ElevenLabs
    return ElevenLabs(api_key=key, base_url=server.url, httpx_client=http)


def test_elevenlabs_http(server, http):
    el = elevenlabs_client(server, http)
    tts, voice = el.text_to_speech, "21m00Tcm4TlvDq8ikWAM"
    audio = b"".join(tts.convert(voice, text=TEXT, output_format="pcm_16000", model_id="eleven_flash_v2_5",
                                 optimize_streaming_latency=2, voice_settings={"stability": 0.5}, seed=7))
    assert pcm_frames(audio, 16000) == FRAMES
    mp3 = b"".join(tts.stream(voice, text=TEXT, output_format="mp3_44100_128", previous_text="Before."))
    assert mp3_close(mp3, FRAMES * 3528)

    whole = tts.convert_with_timestamps(voice, text=TEXT, output_format="pcm_24000")
    assert pcm_frames(base64.b64decode(whole.audio_base_64), 24000) == FRAMES
    a = whole.alignment
    assert "".join(a.characters) == TEXT and a == whole.normalized_alignment
    assert a.character_start_times_seconds == sorted(a.character_start_times_seconds)
    assert a.character_end_times_seconds[-1] <= FRAMES * 0.08

    chunks = list(tts.stream_with_timestamps(voice, text=TEXT, output_format="pcm_16000"))
    assert pcm_frames(b"".join(base64.b64decode(c.audio_base_64) for c in chunks), 16000) == FRAMES
    assert "".join(ch for c in chunks if c.alignment for ch in c.alignment.characters) == TEXT

    models = el.models.list()
    assert models[0].model_id == "talkgate" and models[0].can_do_text_to_speech
    assert "eleven_flash_v2_5" in [m.model_id for m in models]

    from elevenlabs.core.api_error import ApiError
    with pytest.raises(ApiError) as e:
        b"".join(tts.convert("no-such-voice", text=TEXT))
    assert e.value.status_code == 400 and e.value.body["detail"]["status"] == "voice_not_found"
    with pytest.raises(ApiError) as e:
        b"".join(elevenlabs_client(server, http, "wrong").text_to_speech.convert(voice, text=TEXT))
    assert e.value.status_code == 401


def test_elevenlabs_realtime_over_wss(server, http):
    """The SDK's realtime helper always connects with wss://."""
    el = elevenlabs_client(server, http)
    words = iter(["Hello ", "there, ", "how are ", "you?"])
    audio = b"".join(el.text_to_speech.convert_realtime("21m00Tcm4TlvDq8ikWAM", text=words,
                                                        output_format="pcm_16000"))
    assert pcm_frames(audio, 16000) == frames_for_text("Hello there, how are you? ")


# ----- Cartesia -----
def cartesia_client(server, http):
    from cartesia import Cartesia
    return Cartesia(api_key=KEY, base_url=server.url, http_client=http)


def test_cartesia_http(server, http):
    c = cartesia_client(server, http)
    raw = c.tts.generate(model_id="sonic-3", transcript=TEXT, voice="ryan",
                         output_format={"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}).read()
    assert pcm_frames(raw, 16000) == FRAMES
    wav = c.tts.generate(model_id="sonic-3", transcript=TEXT, voice={"id": "ryan"},
                         output_format={"container": "wav", "encoding": "pcm_s16le", "sample_rate": 24000}).read()
    assert wav[:4] == b"RIFF" and pcm_frames(wav[44:], 24000) == FRAMES
    mp3 = c.tts.generate(model_id="sonic-3", transcript=TEXT, voice={"mode": "id", "id": "ryan"},
                         output_format={"container": "mp3", "sample_rate": 24000, "bit_rate": 64000}).read()
    assert mp3_close(mp3, FRAMES * 1920)

    events = list(c.tts.generate_sse(model_id="sonic-3", transcript="Hello there, how are you?", voice="ryan",
                                     output_format={"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000},
                                     add_timestamps=True, context_id="sse-1"))
    assert events[-1].type == "done" and all(e.context_id == "sse-1" for e in events)
    audio = b"".join(e.audio for e in events if e.type == "chunk")
    assert len(audio) == frames_for_text("Hello there, how are you?") * 1920 * 4
    words = [w for e in events if e.type == "timestamps" for w in e.word_timestamps.words]
    assert words == ["Hello", "there,", "how", "are", "you?"]

    import cartesia
    with pytest.raises(cartesia.BadRequestError) as e:
        c.tts.generate(model_id="sonic-3", transcript=TEXT, voice="ryan",
                       output_format={"container": "ogg", "encoding": "pcm_s16le", "sample_rate": 16000})
    assert e.value.body["error_code"] == "invalid_output_format"


def test_cartesia_websocket(server, http):
    c = cartesia_client(server, http)
    fmt = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000}
    with c.tts.websocket_connect() as conn:
        ctx = conn.context(model_id="sonic-3", voice="ryan", output_format=fmt)
        ctx.push("Hello there. ", flush=True)
        ctx.push("Bye now.")
        ctx.no_more_inputs()
        events = list(ctx.receive())
    kinds = [e.type for e in events]
    assert kinds[-1] == "done" and kinds.count("flush_done") == 1
    flushed = kinds.index("flush_done")
    before = b"".join(base64.b64decode(e.data) for e in events[:flushed] if e.type == "chunk")
    after = b"".join(base64.b64decode(e.data) for e in events[flushed:] if e.type == "chunk")
    # one engine context across the flush: the text-length rule counts the whole text
    n1 = frames_for_text("Hello there. ")
    assert pcm_frames(before, 16000) == n1
    assert pcm_frames(after, 16000) == frames_for_text("Hello there. Bye now.") - n1


# ----- Deepgram -----
def deepgram_client(server, http, key=KEY):
    from deepgram import DeepgramClient, DeepgramClientEnvironment
    env = DeepgramClientEnvironment(base=server.url, production=server.ws_url, agent=server.ws_url,
                                    agent_rest=server.url)
    return DeepgramClient(api_key=key, environment=env, httpx_client=http)


def test_deepgram_rest(server, http):
    dg = deepgram_client(server, http)
    mp3 = b"".join(dg.speak.v1.audio.generate(text=TEXT))        # Deepgram's default: MP3 at 22050 Hz
    assert mp3_close(mp3, FRAMES * 1764)
    pcm = b"".join(dg.speak.v1.audio.generate(text=TEXT, model="aura-2-thalia-en", encoding="linear16",
                                              sample_rate=16000, container="none"))
    assert pcm_frames(pcm, 16000) == FRAMES
    wav = b"".join(dg.speak.v1.audio.generate(text=TEXT, encoding="linear16"))
    assert wav[:4] == b"RIFF" and pcm_frames(wav[44:], 24000) == FRAMES
    for enc, container in (("aac", "aac"), ("opus", "ogg"), ("flac", "flac")):
        assert decoded_samples(b"".join(dg.speak.v1.audio.generate(text=TEXT, encoding=enc)), container) > 0, enc
    mulaw = b"".join(dg.speak.v1.audio.generate(text=TEXT, encoding="mulaw", container="none"))
    assert len(mulaw) == FRAMES * 640

    from deepgram.core.api_error import ApiError
    with pytest.raises(ApiError) as e:
        b"".join(dg.speak.v1.audio.generate(text=TEXT, encoding="linear16", sample_rate=11025))
    assert e.value.status_code == 400 and e.value.body["err_code"] == "UNSUPPORTED_SAMPLE_RATE"


def test_deepgram_websocket(server, http):
    from deepgram.speak.v1.types import SpeakV1Close, SpeakV1Flush, SpeakV1Text
    dg = deepgram_client(server, http)
    with dg.speak.v1.connect(model="aura-2-thalia-en", encoding="linear16", sample_rate=16000) as ws:
        ws.send_text(SpeakV1Text(type="Speak", text="Hello there. "))
        ws.send_flush(SpeakV1Flush(type="Flush"))
        ws.send_text(SpeakV1Text(type="Speak", text="Bye now."))
        ws.send_flush(SpeakV1Flush(type="Flush"))
        ws.send_close(SpeakV1Close(type="Close"))
        messages = list(ws)
    assert messages[0].type == "Metadata" and messages[0].model_name == "aura-2-thalia-en"
    flushed = [i for i, m in enumerate(messages) if getattr(m, "type", None) == "Flushed"]
    assert [messages[i].sequence_id for i in flushed] == [0, 1]
    n1 = frames_for_text("Hello there. ")
    assert pcm_frames(b"".join(m for m in messages[:flushed[0]] if isinstance(m, bytes)), 16000) == n1
    later = b"".join(m for m in messages[flushed[0]:flushed[1]] if isinstance(m, bytes))
    assert pcm_frames(later, 16000) == frames_for_text("Hello there. Bye now.") - n1


# ----- Deepgram Flux TTS: /v2/speak -----
def flux_until(ws, kind: str) -> list:
    """What the SDK's v2 socket receives, up to and including the first message of type `kind`."""
    out = []
    while getattr(out[-1] if out else None, "type", None) != kind:
        out.append(ws.recv())
    return out


def flux_audio(messages: list) -> bytes:
    return b"".join(m for m in messages if isinstance(m, bytes))


def test_deepgram_flux_turns_configure_close(server, http):
    from deepgram.speak.v2.types import SpeakV2Configure, SpeakV2Speak
    dg = deepgram_client(server, http)
    n1 = frames_for_text("Hello there. ")
    n2 = frames_for_text("Hello there. Bye now.") - n1
    with dg.speak.v2.connect(model="flux-alexis-en", encoding="linear16", sample_rate=16000) as ws:
        connected = ws.recv()
        assert connected.type == "Connected" and connected.model_name == "flux-alexis-en" and connected.model_uuids
        ws.send_speak(SpeakV2Speak(text="Hello there. "))
        ws.send_flush()
        first = flux_until(ws, "SpeechMetadata")
        ws.send_configure(SpeakV2Configure(speed=1.5))
        assert ws.recv().applied.speed == 1.5           # ConfigureSuccess
        ws.send_speak(SpeakV2Speak(text="Bye now."))
        ws.send_flush()
        second = flux_until(ws, "SpeechMetadata")
        ws.send_close()
        rest = list(ws)
    # every frame of a turn between its SpeechStarted and its SpeechMetadata
    for turn in (first, second):
        assert turn[0].type == "SpeechStarted" and all(isinstance(m, bytes) for m in turn[1:-2])
        assert turn[-2].type == "Flushed" and turn[-2].speech_id == turn[-1].speech_id == turn[0].speech_id
    assert first[0].speech_id != second[0].speech_id
    assert pcm_frames(flux_audio(first), 16000) == n1 and first[-1].audio_duration_ms == n1 * 80
    assert first[-1].input_character_count == len("Hello there. ")
    # speed 1.5: the second turn is time-stretched (pitch kept) to 1/1.5 of its length
    assert abs(len(flux_audio(second)) / 2 - n2 * 1280 / 1.5) <= 1
    assert abs(second[-1].audio_duration_ms - n2 * 80 / 1.5) <= 1
    (session,) = rest                                     # then the server closed with 1000
    assert session.type == "SessionMetadata" and session.total_input_character_count == len("Hello there. Bye now.")


def test_deepgram_flux_interrupt(server, http):
    from deepgram.speak.v2.types import SpeakV2Interrupt, SpeakV2InterruptPlaybackOffset, SpeakV2Speak
    dg = deepgram_client(server, http)
    text = "Hello there, this turn is cut short by the caller."
    with dg.speak.v2.connect(model="flux-alexis-en") as ws:
        assert ws.recv().type == "Connected"
        ws.send_speak(SpeakV2Speak(text=text))             # no Flush: the turn is still being made
        assert ws.recv().type == "SpeechStarted" and isinstance(ws.recv(), bytes)
        ws.send_interrupt(SpeakV2Interrupt(playback_offset=SpeakV2InterruptPlaybackOffset(value=400)))
        cut = flux_until(ws, "SpeechInterrupted")
        ws.send_speak(SpeakV2Speak(text="Sorry, go on."))
        ws.send_flush()
        after = flux_until(ws, "SpeechMetadata")
        ws.send_close()
        list(ws)
    assert all(isinstance(m, bytes) for m in cut[:-1])    # only frames already on the wire before the report
    report = cut[-1]
    # 400 ms at the estimate's 14 characters a second: 5.6 -> 6 characters, "Hello "
    assert report.audio_played_ms == 400 and report.text_spoken == "Hello " and report.text_remaining == text[6:]
    assert report.metadata.input_character_count == len(text)
    # nothing of the cut turn follows the report: the next message starts the next turn
    assert after[0].type == "SpeechStarted" and after[0].speech_id != report.metadata.speech_id
    assert pcm_frames(flux_audio(after), 24000) == frames_for_text("Sorry, go on.")


def test_deepgram_flux_errors(server, http):
    from deepgram.speak.v2.types import SpeakV2Configure, SpeakV2Speak
    from websockets.exceptions import ConnectionClosedError, InvalidStatus
    dg = deepgram_client(server, http)
    # a bad query: refused before the upgrade, as Deepgram does. The SDK's sync connect means to turn that into
    # ApiError but catches the legacy websockets exception, so the sync client's InvalidStatus comes through
    with pytest.raises(InvalidStatus) as e:
        with dg.speak.v2.connect(model="flux-alexis-en", speed=2.0):
            pass
    assert e.value.response.status_code == 400
    assert json.loads(e.value.response.body)["err_code"] == "SPEED_OUT_OF_RANGE"
    # without a valid key the query is never read (its errors name the models and voices): refused like every socket
    with pytest.raises(ConnectionClosedError) as refused:
        with deepgram_client(server, http, key="not-the-key").speak.v2.connect(model="nope", speed=2.0) as ws:
            ws.recv()
    assert refused.value.rcvd.code == 1008 and refused.value.rcvd.reason == "unauthorized"
    with dg.speak.v2.connect(model="flux-alexis-en") as ws:
        assert ws.recv().type == "Connected"
        ws.send_configure(SpeakV2Configure(speed=1.12))
        failure = ws.recv()                                # the socket lives on
        assert failure.type == "ConfigureFailure" and failure.code == "SPEED_INCREMENT_INVALID"
        assert failure.field == "speed" and failure.value == 1.12
        ws.send_speak(SpeakV2Speak(text="x" * 2001))       # over Deepgram's limit for one Speak
        error = ws.recv()
        assert error.type == "Error" and error.code == "BIG-0000" and error.description
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv()
    assert closed.value.rcvd.code == 1008


# ----- DashScope: Qwen-TTS realtime -----
class DashScopeEvents:
    """A QwenTtsRealtimeCallback's events (the SDK hands on_event the parsed JSON), waited on from the test."""

    def __init__(self):
        import queue

        from dashscope.audio.qwen_tts_realtime import QwenTtsRealtimeCallback
        self.queue: queue.Queue = queue.Queue(maxsize=10_000)
        events = self.queue

        class Callback(QwenTtsRealtimeCallback):
            def on_event(self, message):
                events.put_nowait(message)

            def on_close(self, close_status_code, close_msg):
                events.put_nowait({"type": "closed", "code": close_status_code})

        self.callback = Callback()

    def until(self, kind: str) -> list[dict]:
        """The events up to and including the first of type `kind`."""
        out: list[dict] = []
        while not out or out[-1]["type"] != kind:
            out.append(self.queue.get(timeout=30))
        return out


@pytest.fixture
def dashscope_connect(server, tls, monkeypatch):
    """connect(key) -> a connected QwenTtsRealtime pointed at talkgate and its events; each is closed after the
    test, and its thread (the SDK's run_forever) joined. websocket-client (the SDK's library) leaves its socket
    open when the server closes first (its close() returns early once the close frame came), so the socket it
    used is shut here too."""
    import dashscope
    from dashscope.audio.qwen_tts_realtime import QwenTtsRealtime
    clients, sockets = [], []

    def connect():
        monkeypatch.setattr(dashscope, "api_key", KEY)
        events = DashScopeEvents()
        client = QwenTtsRealtime(model="qwen-tts-realtime", callback=events.callback,
                                 url=f"{server.ws_url}/api-ws/v1/realtime")
        clients.append(client)
        client.connect()
        sockets.append(client.ws.sock)
        assert events.until("session.created")[-1]["session"]["model"] == "qwen-tts-realtime"
        return client, events

    yield connect
    for client in clients:
        client.close()
        client.thread.join(10)
    for sock in sockets:
        if sock is not None:
            sock.shutdown()


def dashscope_audio(events: list[dict]) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.audio.delta")


def dashscope_types(events: list[dict]) -> list[str]:
    """The event types, a run of audio deltas as one."""
    out: list[str] = []
    for e in events:
        if not (out and e["type"] == out[-1] == "response.audio.delta"):
            out.append(e["type"])
    return out


DASHSCOPE_RESPONSE = ["response.created", "response.output_item.added", "response.content_part.added",
                      "response.audio.delta", "response.audio.done", "response.content_part.done",
                      "response.output_item.done", "response.done"]


def test_dashscope_server_commit_streamed_text_then_finish(dashscope_connect):
    from dashscope.audio.qwen_tts_realtime import AudioFormat
    client, events = dashscope_connect()
    client.update_session(voice="Cherry", response_format=AudioFormat.PCM_24000HZ_MONO_16BIT, mode="server_commit")
    updated = events.until("session.updated")[-1]
    assert updated["session"]["voice"] == "Cherry" and updated["session"]["mode"] == "server_commit"
    for piece in ("Hello ", "there."):
        client.append_text(piece)
    client.finish()
    out = events.until("session.finished")
    kinds = dashscope_types(out)
    # the text went to the engine as it came: the audio may start before finish commits it
    assert kinds.count("input_text_buffer.committed") == 1
    kinds.remove("input_text_buffer.committed")
    assert dashscope_types([{"type": k} for k in kinds]) == [*DASHSCOPE_RESPONSE, "session.finished"]
    assert pcm_frames(dashscope_audio(out), 24000) == FRAMES
    done = [e for e in out if e["type"] == "response.done"][0]
    assert done["response"]["status"] == "completed" and done["response"]["id"] == client.get_last_response_id()
    assert events.until("closed")[-1]["code"] == 1000       # the server closed the socket
    assert client.get_session_id().startswith("sess_")


def test_dashscope_commit_clear_cancel(dashscope_connect):
    client, events = dashscope_connect()
    client.update_session(voice="Serena", mode="commit", audio_format="pcm", sample_rate=16000)
    events.until("session.updated")
    client.append_text("Hello there. ")
    client.commit()
    first = events.until("response.done")
    assert first[0]["item_id"] == first[2]["item"]["id"]      # the committed text is the response's item
    assert dashscope_types(first) == ["input_text_buffer.committed", *DASHSCOPE_RESPONSE]
    n1 = frames_for_text("Hello there. ")
    assert pcm_frames(dashscope_audio(first), 16000) == n1
    # clear drops the text not yet committed: committing then has nothing to commit
    client.append_text("Never said.")
    client.clear_appended_text()
    assert events.until("input_text_buffer.cleared")[-1]["type"] == "input_text_buffer.cleared"
    client.commit()
    error = events.until("error")[-1]["error"]
    assert error["code"] == "input_text_buffer_commit_empty" and error["type"] == "invalid_request_error"
    # barge-in: a long response cancelled after its first delta; no delta of it follows response.done
    client.append_text("This answer is long and the caller cuts it short, long before it ends.")
    client.commit()
    events.until("response.audio.delta")
    client.cancel_response()
    cut = events.until("response.done")
    assert cut[-1]["response"]["status"] == "cancelled"
    client.append_text("Bye now.")
    client.commit()
    after = events.until("response.done")
    assert after[0]["type"] == "input_text_buffer.committed"   # nothing of the cancelled response came between
    assert after[-1]["response"]["status"] == "completed"
    assert pcm_frames(dashscope_audio(after), 16000) == frames_for_text("Bye now.")
    client.finish()
    assert events.until("session.finished")[-1]["type"] == "session.finished"


@pytest.mark.parametrize("fmt, rate, magic", [("mp3", 24000, None), ("wav", 24000, b"RIFF"), ("opus", 48000, b"OggS")])
def test_dashscope_formats(dashscope_connect, fmt, rate, magic):
    client, events = dashscope_connect()
    client.update_session(voice="Ethan", mode="commit", audio_format=fmt, sample_rate=rate)
    events.until("session.updated")
    client.append_text(TEXT)
    client.finish()
    audio = dashscope_audio(events.until("session.finished"))
    assert magic is None or audio.startswith(magic)
    samples = decoded_samples(audio, {"mp3": "mp3", "wav": "wav", "opus": "ogg"}[fmt]) * 24000 // rate
    assert 0 <= samples - FRAMES * 1920 <= 2048 + 1152


def test_dashscope_errors(dashscope_connect):
    client, events = dashscope_connect()
    client.update_session(voice="Nobody")
    error = events.until("error")[-1]
    assert error["error"]["code"] == "invalid_value" and error["error"]["param"] == "session.voice"
    assert error["event_id"].startswith("event_")
    client.send_raw("{not json")
    assert events.until("error")[-1]["error"]["code"] == "invalid_json"
    client.send_raw(json.dumps({"type": "response.create"}))
    assert events.until("error")[-1]["error"]["code"] == "invalid_event"
    client.update_session(voice="Cherry", mode="commit", sample_rate=12345)
    assert events.until("error")[-1]["error"]["param"] == "session.sample_rate"
    client.update_session(voice="Cherry")                   # the socket lived on through every error
    assert events.until("session.updated")[-1]["session"]["voice"] == "Cherry"



def test_dashscope_wrong_key_and_no_model(server, tls):
    """The refusals, in the SDK's headers and URL (its connect() only times out on a closed socket: websockets here)."""
    from websockets.exceptions import ConnectionClosedError, InvalidStatus
    from websockets.sync.client import connect
    url = f"{server.ws_url}/api-ws/v1/realtime"
    with connect(f"{url}?model=qwen-tts-realtime", ssl=tls, additional_headers={"Authorization": "Bearer wrong"}) as ws:
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd.code == 1008
    with pytest.raises(InvalidStatus) as refused:
        connect(url, ssl=tls, additional_headers={"Authorization": f"Bearer {KEY}"})
    assert refused.value.response.status_code == 400
    assert json.loads(refused.value.response.body)["code"] == "InvalidParameter"




# ----- DashScope: Qwen TTS over HTTP (MultiModalConversation.call, qwen_tts.SpeechSynthesizer.call) -----
@pytest.fixture
def dashscope_http(server, cert, monkeypatch):
    """The SDK pointed at talkgate (dashscope.base_http_api_url, its documented setting, read at every call; or
    DASHSCOPE_HTTP_BASE_URL before it is imported); requests trusts the certificate through REQUESTS_CA_BUNDLE. The
    SDK's shared requests session is closed after the test with the connections it keeps."""
    import dashscope
    monkeypatch.setattr(dashscope, "base_http_api_url", f"{server.url}/api/v1")
    monkeypatch.setattr(dashscope, "api_key", KEY)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert[0]))
    yield dashscope
    dashscope.close_shared_sync_session()


def test_dashscope_http_streamed(dashscope_http):
    from dashscope.audio.qwen_tts import SpeechSynthesizer
    responses = list(dashscope_http.MultiModalConversation.call(model="qwen3-tts-flash", text=TEXT, voice="Cherry",
                                                                language_type="English", stream=True))
    assert {r.status_code for r in responses} == {200}
    audio = b"".join(base64.b64decode(r.output.audio.data) for r in responses if r.output.audio.data)
    assert pcm_frames(audio, 24000) == FRAMES                   # PCM s16le 24 kHz, as DashScope streams it
    assert [r.output.finish_reason for r in responses][-2:] == ["null", "stop"]
    assert responses[-1].usage.characters == len(TEXT) and responses[-1].request_id == responses[0].request_id
    # the older client of the same endpoint (qwen-tts): the same events in its own response class
    responses = list(SpeechSynthesizer.call(model="qwen-tts", text=TEXT, voice="Ethan", stream=True))
    audio = b"".join(base64.b64decode(r.output.audio["data"]) for r in responses)   # a dict in this class
    assert pcm_frames(audio, 24000) == FRAMES and responses[-1].output.finish_reason == "stop"


def test_dashscope_http_url_of_a_wav(dashscope_http, tls):
    response = dashscope_http.MultiModalConversation.call(model="qwen3-tts-flash", text=TEXT, voice="Serena")
    assert response.status_code == 200 and response.output.finish_reason == "stop"
    audio = response.output.audio
    assert audio.data == "" and audio.id.startswith("audio_") and audio.expires_at > time.time() + 600
    wav = httpx.get(audio.url, verify=tls)                      # no key: the id is the access rule
    assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
    assert wav.content[:4] == b"RIFF" and decoded_samples(wav.content, "wav") == FRAMES * 1920
    assert response.usage.characters == len(TEXT)
    gone = httpx.get(audio.url.replace(audio.id, "audio_" + "0" * 32), verify=tls)
    assert gone.status_code == 404 and gone.json()["code"] == "NotFound"


def test_dashscope_http_errors(dashscope_http):
    call = dashscope_http.MultiModalConversation.call
    for kwargs, status, code in (({"voice": "Nobody"}, 400, "InvalidParameter"),
                                 ({"model": "qwen-nope"}, 404, "ModelNotFound"),
                                 ({"text": "", "voice": "Cherry"}, 400, "InvalidParameter"),
                                 ({"api_key": "wrong"}, 401, "InvalidApiKey")):
        for stream in (False, True):
            args = {"model": "qwen3-tts-flash", "text": TEXT, **kwargs, "stream": stream}
            response = call(**args)
            if stream:
                (response,) = list(response)
            assert (response.status_code, response.code) == (status, code), args
            assert response.message and response.request_id


# ----- emotion and instructions on this 0.6B checkpoint (the fields themselves: test_compat_fields.py) -----
def test_instructions_on_a_checkpoint_without_them(server, http):
    """0.6B CustomVoice: OpenAI's instructions are ignored as the reference ignores them (the same seed makes the
    same audio); a vendor's emotion or style is refused in the vendor's shape, never dropped."""
    import cartesia
    import openai
    speech = openai.OpenAI(api_key=KEY, base_url=f"{server.url}/v1", http_client=http).audio.speech

    def say(**kw) -> bytes:
        return speech.create(model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm",
                             extra_body={"seed": 7}, **kw).read()

    assert say() == say(instructions="Speak calmly.")
    with pytest.raises(cartesia.BadRequestError) as e:
        cartesia_client(server, http).tts.generate(
            model_id="sonic-3", transcript=TEXT, voice="ryan", generation_config={"emotion": "sad"},
            output_format={"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000})
    assert e.value.body["error_code"] == "expression_unsupported"
    from elevenlabs import VoiceSettings
    from elevenlabs.core.api_error import ApiError
    with pytest.raises(ApiError) as e:
        b"".join(elevenlabs_client(server, http).text_to_speech.convert(
            "21m00Tcm4TlvDq8ikWAM", text=TEXT, voice_settings=VoiceSettings(style=0.5)))
    assert e.value.status_code == 400 and e.value.body["detail"]["status"] == "expression_unsupported"
