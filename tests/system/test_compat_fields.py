"""The vendors' delivery fields (issue 48 item 3; docs/compat.md "Vendor fields"), sent by the official SDKs
unmodified to a real `talkgate serve` over TLS (as tests/system/test_compat_sdks.py): speed -> the pitch-kept tempo
(exact lengths: the tiny checkpoint's contexts end by the text-length rule), volume -> a gain, emotion / style ->
the model's instructions, and the refusals in each vendor's shape.

The server's checkpoint is the tiny CustomVoice one relabelled 1.7B (`tts_model_size` 1b7 in its config.json): the
size that reads instructions (synth/prompt.py), so an instruction changes the audio; the 0.6B refusals are in
test_compat_sdks.py.
"""
from __future__ import annotations

import base64
import json
import shutil

import numpy as np
import pytest

from talkgate.synth.request import frames_for_text
from tests.serverproc import TalkgateServer
from tests.system.test_compat_sdks import (  # noqa: F401  (fixtures)
    FRAMES, KEY, TEXT, cartesia_client, cert, dashscope_audio, dashscope_connect, deepgram_client, elevenlabs_client,
    http, tls,
)


@pytest.fixture(scope="module")
def server(tiny_checkpoint, cert, tmp_path_factory):  # noqa: F811
    ckpt = tmp_path_factory.mktemp("ckpt") / "tiny-1b7"
    shutil.copytree(tiny_checkpoint, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "tts_model_size": "1b7"}))
    with TalkgateServer(ckpt, "--api-key", KEY, "--ssl-certfile", str(cert[0]), "--ssl-keyfile",
                        str(cert[1])) as srv:
        yield srv


def tempo_bytes(speed: float, frames: int = FRAMES, width: int = 2) -> int:
    """s16le (or f32le) bytes at 24 kHz of `frames` 80-ms frames at `speed` (the tempo's exact length)."""
    return width * round(frames * 1920 / speed)


def rms(audio: bytes, dtype=np.int16) -> float:
    return float(np.sqrt(np.mean(np.frombuffer(audio, dtype).astype(np.float64) ** 2)))


def test_openai_speed_instructions(server, http):
    import openai
    speech = openai.OpenAI(api_key=KEY, base_url=f"{server.url}/v1", http_client=http).audio.speech

    def say(**kw) -> bytes:
        return speech.create(model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm",
                             extra_body={"seed": 7}, **kw).read()

    assert len(say(speed=1.25)) == tempo_bytes(1.25)
    plain, calm, calm_again = say(), say(instructions="Speak calmly."), say(instructions="Speak calmly.")
    # the instructions reach the model: the same seed makes other audio with them, the same audio again
    assert len(plain) == len(calm) == FRAMES * 1920 * 2 and calm == calm_again and calm != plain
    with pytest.raises(openai.BadRequestError) as e:
        say(speed=5)
    assert e.value.body["code"] == "invalid_request"


def test_elevenlabs_voice_settings(server, http):
    from elevenlabs import VoiceSettings
    from elevenlabs.core.api_error import ApiError
    el = elevenlabs_client(server, http)
    voice = "21m00Tcm4TlvDq8ikWAM"
    audio = b"".join(el.text_to_speech.convert(
        voice, text=TEXT, output_format="pcm_24000", previous_text="Before.", next_text="After.",
        apply_text_normalization="off",
        voice_settings=VoiceSettings(speed=1.2, style=0.5, stability=0.4, similarity_boost=0.7, use_speaker_boost=True)))
    assert len(audio) == tempo_bytes(1.2)
    with pytest.raises(ApiError) as e:
        b"".join(el.text_to_speech.convert(voice, text=TEXT, voice_settings=VoiceSettings(speed=2.0)))
    assert e.value.status_code == 400 and e.value.body["detail"]["status"] == "invalid_voice_settings"
    # the realtime helper (wss://): voice_settings in its first message, chunk_length_schedule [50]
    words = iter(["Hello ", "there."])
    audio = b"".join(el.text_to_speech.convert_realtime(voice, text=words, output_format="pcm_24000",
                                                        voice_settings=VoiceSettings(speed=0.8, style=1.0)))
    assert len(audio) == tempo_bytes(0.8, frames_for_text("Hello there. "))


def test_cartesia_generation_config(server, http):
    import cartesia
    c = cartesia_client(server, http)
    f32 = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}

    def say(**kw) -> bytes:
        return c.tts.generate(model_id="sonic-3", transcript=TEXT, voice="ryan", output_format=f32, **kw).read()

    assert len(say(generation_config={"speed": 1.5, "emotion": "sad"})) == tempo_bytes(1.5, width=4)
    loud, quiet = say(generation_config={"volume": 2.0}), say(generation_config={"volume": 0.5})
    assert len(loud) == len(quiet) == FRAMES * 1920 * 4
    assert rms(loud, np.float32) > 2 * rms(quiet, np.float32) and np.abs(np.frombuffer(loud, np.float32)).max() <= 1
    for kw, code in (({"generation_config": {"emotion": "grumpy"}}, "invalid_generation_config"),
                     ({"generation_config": {"volume": 3}}, "invalid_generation_config")):
        with pytest.raises(cartesia.BadRequestError) as e:
            say(**kw)
        assert e.value.body["error_code"] == code

    events = list(c.tts.generate_sse(model_id="sonic-3", transcript=TEXT, voice="ryan", output_format=f32,
                                     add_timestamps=True, use_normalized_timestamps=True,
                                     generation_config={"speed": 0.8}))
    assert len(b"".join(e.audio for e in events if e.type == "chunk")) == tempo_bytes(0.8, width=4)
    assert [w for e in events if e.type == "timestamps" for w in e.word_timestamps.words] == ["Hello", "there."]
    with pytest.raises(cartesia.BadRequestError) as e:
        list(c.tts.generate_sse(model_id="sonic-3", transcript=TEXT, voice="ryan", output_format=f32,
                                add_phoneme_timestamps=True))
    assert e.value.body["error_code"] == "phoneme_timestamps_unsupported"

    with c.tts.websocket_connect() as conn:
        ctx = conn.context(model_id="sonic-3", voice="ryan", output_format=f32, max_buffer_delay_ms=3000,
                           generation_config={"speed": 1.25, "volume": 1.5, "emotion": "excited"})
        ctx.push("Hello there.")
        ctx.no_more_inputs()
        events = list(ctx.receive())
        assert events[-1].type == "done"
        assert len(b"".join(base64.b64decode(e.data) for e in events if e.type == "chunk")) == tempo_bytes(1.25, width=4)
        bad = conn.context(model_id="sonic-3", voice="ryan", output_format=f32, add_phoneme_timestamps=True)
        bad.push("Hello.")
        (err,) = list(bad.receive())
        assert err.type == "error" and err.error_code == "phoneme_timestamps_unsupported" and err.done


def test_deepgram_speed(server, http):
    from deepgram.core.api_error import ApiError
    from deepgram.speak.v1.types import SpeakV1Close, SpeakV1Text
    dg = deepgram_client(server, http)
    pcm = b"".join(dg.speak.v1.audio.generate(text=TEXT, encoding="linear16", container="none", speed=1.25))
    assert len(pcm) == tempo_bytes(1.25)
    with pytest.raises(ApiError) as e:
        b"".join(dg.speak.v1.audio.generate(text=TEXT, encoding="linear16", speed=2.0))
    assert e.value.status_code == 400 and e.value.body["err_code"] == "SPEED_OUT_OF_RANGE"
    with dg.speak.v1.connect(model="aura-2-thalia-en", encoding="linear16", sample_rate=24000, speed=0.8) as ws:
        ws.send_text(SpeakV1Text(type="Speak", text=TEXT))
        ws.send_close(SpeakV1Close(type="Close"))
        audio = b"".join(m for m in ws if isinstance(m, bytes))
    assert len(audio) == tempo_bytes(0.8)


def test_dashscope_volume(dashscope_connect):
    """volume (0 to 100, 50 the voice's own) is a gain of volume / 50."""
    audio = {}
    for volume in (100, 10):
        client, events = dashscope_connect()
        client.update_session(voice="Cherry", mode="server_commit", volume=volume)
        assert events.until("session.updated")[-1]["session"]["volume"] == volume
        client.append_text(TEXT)
        client.finish()
        audio[volume] = dashscope_audio(events.until("session.finished"))
        assert len(audio[volume]) == FRAMES * 1920 * 2
    assert rms(audio[100]) > 4 * rms(audio[10])


def test_elevenlabs_ssml_over_a_real_socket(server, tls):
    """enable_ssml_parsing, which the SDK's helper cannot set: a raw stream-input socket, the tags split across
    messages; the break is silence between the two segments' audio."""
    from websockets.sync.client import connect
    url = (f"{server.ws_url}/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM/stream-input?output_format=pcm_24000"
           "&enable_ssml_parsing=true&sync_alignment=true&auto_mode=true&apply_text_normalization=auto")
    with connect(url, ssl=tls, additional_headers={"xi-api-key": KEY}) as ws:
        for text in (" ", "<speak>Hello <bre", 'ak time="400ms"/>there.</speak>', ""):
            ws.send(json.dumps({"text": text}))
        messages = [json.loads(m) for m in ws]
    assert messages[-1] == {"isFinal": True}
    audio = np.frombuffer(b"".join(base64.b64decode(m["audio"]) for m in messages if m.get("audio")), np.int16)
    first = frames_for_text("Hello ") * 1920
    assert len(audio) == frames_for_text("Hello there.") * 1920 + 9600
    assert not audio[first:first + 9600].any() and audio[first - 1920:first].any()
    assert "".join(c for m in messages if m.get("alignment") for c in m["alignment"]["chars"]) == "Hello there."
