"""The vendors' delivery fields (issue 48 item 3), Sans-I/O: speed -> the pitch-kept tempo, volume -> a clipped gain,
emotion / style -> the instruction the engine is given (sessions/expression.py's table), and each vendor's refusals
in its own shape. Engine events are built in the test (tests/compat_harness.py)."""
from __future__ import annotations

import base64
from dataclasses import replace

import numpy as np
import pytest

from talkgate.sessions.cartesia import CartesiaProtocol
from talkgate.sessions.expression import EMOTIONS, emotion_phrase, style_phrase
from talkgate.sessions.models import Model, Models
from talkgate.sessions.voices import VoiceMap
from talkgate.synth.api import FRAME_SAMPLES, OpenContext
from tests.compat_harness import INFO, Harness, jsons, pcm

VOICE = "11111111-2222-3333-4444-555555555555"
F32 = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}
BASE = Models([Model("base", replace(INFO, name="base", model_type="base", voices=(), takes_instructions=False))])
SMALL = Models([Model("small", replace(INFO, name="small", size="0b6", takes_instructions=False))])


def params(h: Harness):
    return [c.params for c in h.commands if isinstance(c, OpenContext)]


# ----- Cartesia -----
def cartesia(tokenizer, models: Models | None = None):
    voices = VoiceMap({"cartesia": {VOICE: INFO.voices[0]}})
    h = Harness(tokenizer, lambda s: CartesiaProtocol(s, "s1", voices), models=models)
    assert h.ready() == []
    return h


def request(cid, transcript, cont=False, **extra):
    return {"context_id": cid, "model_id": "sonic-3", "transcript": transcript, "continue": cont,
            "voice": {"mode": "id", "id": VOICE}, "output_format": F32, **extra}


def cartesia_pcm(h: Harness, cid: str) -> np.ndarray:
    out = jsons(h.deliver())
    assert out[-1]["type"] == "done" and out[-1]["context_id"] == cid
    return np.frombuffer(b"".join(base64.b64decode(m["data"]) for m in out if m["type"] == "chunk"), np.float32)


@pytest.mark.parametrize("speed", [0.6, 1.0, 1.5])
def test_cartesia_generation_config_speed_is_the_tempo(tokenizer, speed):
    h = cartesia(tokenizer)
    h.send(request("c", "Hello there. ", generation_config={"speed": speed}))
    h.finish(6)
    assert len(cartesia_pcm(h, "c")) == round(6 * FRAME_SAMPLES / speed)


def test_cartesia_named_speed_and_generation_config_wins(tokenizer):
    h = cartesia(tokenizer)
    h.send(request("a", "Hello there. ", speed="fast"))
    h.send(request("b", "Hello there. ", speed="slow", generation_config={"speed": 1.5}))
    h.finish(6)
    out = jsons(h.deliver())
    sizes = {cid: sum(len(base64.b64decode(m["data"])) // 4 for m in out if m["type"] == "chunk"
                      and m["context_id"] == cid) for cid in "ab"}
    assert sizes == {"a": round(6 * FRAME_SAMPLES / 1.2), "b": round(6 * FRAME_SAMPLES / 1.5)}


def test_cartesia_volume_is_a_clipped_gain(tokenizer):
    h = cartesia(tokenizer)
    h.send(request("c", "Hello there. ", generation_config={"volume": 2.0}))
    h.finish(3)
    expected = np.clip(2 * np.concatenate([pcm(i) for i in range(3)]), -1, 1)
    assert np.array_equal(cartesia_pcm(h, "c"), expected.astype(np.float32))
    # a gain past full scale is clipped, never wrapped
    h = cartesia(tokenizer)
    h.send(request("c", "Hi. ", generation_config={"volume": 2.0}))
    (ctx,) = h.opened()
    from talkgate.synth.api import AudioChunk, ContextDone
    h.event(AudioChunk(ctx, np.full(FRAME_SAMPLES, 0.75, np.float32), 0, 1, 0.0))
    h.event(ContextDone(ctx, "eos", 1))
    assert np.all(cartesia_pcm(h, "c") == 1.0)


def test_cartesia_emotion_is_an_instruction(tokenizer):
    h = cartesia(tokenizer)
    h.send(request("a", "Hi. ", generation_config={"emotion": "angry"}))
    h.send(request("b", "Hi. ", generation_config={"emotion": "anxious", "speed": 1.0}))
    h.send(request("n", "Hi. ", generation_config={"emotion": "neutral"}))
    assert [p.instructions for p in params(h)] == ["Speak in an angry tone.", "Speak in an anxious tone.", None]


@pytest.mark.parametrize("models", [BASE, SMALL], ids=["base", "0.6B"])
def test_cartesia_emotion_refused_where_the_model_takes_no_instructions(tokenizer, models):
    h = Harness(tokenizer, lambda s: CartesiaProtocol(s, "s1", VoiceMap({"cartesia": {VOICE: None}})),
                models=models)
    h.send(request("c", "Hi. ", generation_config={"emotion": "sad"}))
    (err,) = h.queued()
    assert err["type"] == "error" and err["error_code"] == "expression_unsupported" and err["context_id"] == "c"
    assert err["done"] is True and err["status_code"] == 400 and h.live() == []
    h.send(request("d", "Hi. ", generation_config={"emotion": "neutral", "volume": 1.5}))    # neutral works
    assert len(h.live()) == 1


@pytest.mark.parametrize("extra, code", [
    ({"generation_config": {"speed": 2.0}}, "invalid_generation_config"),
    ({"generation_config": {"volume": 0.1}}, "invalid_generation_config"),
    ({"generation_config": {"volume": "loud"}}, "invalid_generation_config"),
    ({"generation_config": {"emotion": "grumpy"}}, "invalid_generation_config"),
    ({"generation_config": [1]}, "invalid_message"),
    ({"speed": "ludicrous"}, "invalid_request"),
    ({"max_buffer_delay_ms": 6000}, "invalid_request"),
    ({"max_buffer_delay_ms": 1.5}, "invalid_message"),
    ({"use_normalized_timestamps": "yes"}, "invalid_message"),
    ({"add_phoneme_timestamps": True}, "phoneme_timestamps_unsupported"),
])
def test_cartesia_bad_fields_are_cartesia_errors(tokenizer, extra, code):
    h = cartesia(tokenizer)
    h.send(request("c", "Hi. ", **extra))
    (err,) = h.queued()
    assert err["type"] == "error" and err["error_code"] == code and err["context_id"] == "c" and err["done"] is True
    assert h.live() == []


def test_cartesia_buffer_delay_and_normalized_timestamps_are_met(tokenizer):
    """max_buffer_delay_ms bounds the wait for text: talkgate sends the text on at once (max_buffer_delay_ms 0 or
    5000 alike); use_normalized_timestamps: the normalized text is the transcript."""
    for delay in (0, 5000):
        h = cartesia(tokenizer)
        h.send(request("c", "Hello there ", cont=True, max_buffer_delay_ms=delay, add_timestamps=True,
                       use_normalized_timestamps=True))
        (ctx,) = h.opened()
        assert h.text_ids(ctx)          # the first words went to the engine before the context's input ended
        h.send(request("c", "", cont=False))
        h.finish(8)
        words = [w for m in jsons(h.deliver()) if m["type"] == "timestamps" for w in m["word_timestamps"]["words"]]
        assert words == ["Hello", "there"]


def test_expression_table():
    assert emotion_phrase("Neutral") is None and all(emotion_phrase(e) for e in EMOTIONS if e != "neutral")
    assert style_phrase(0.0) is None and style_phrase(0.2) != style_phrase(0.5) != style_phrase(1.0)


# ----- ElevenLabs -----
def elevenlabs(tokenizer, query=None, multi=True, models=None):
    from talkgate.sessions.elevenlabs import ElevenLabsProtocol
    voices = VoiceMap({"elevenlabs": {"v1": None}})
    q = {"output_format": "pcm_24000", **(query or {})}
    h = Harness(tokenizer, lambda s: ElevenLabsProtocol(s, "s1", "v1", q, voices, multi), models=models)
    h.ready()
    return h


def elevenlabs_samples(items, cid="c1") -> int:
    return sum(len(base64.b64decode(m["audio"])) // 2 for m in jsons(items) if m.get("audio")
               and m.get("contextId", cid) == cid)


def test_elevenlabs_voice_settings_speed_and_style_per_context(tokenizer):
    h = elevenlabs(tokenizer)
    h.send({"text": " ", "context_id": "c1", "voice_settings": {"speed": 1.2, "stability": 0.3,
                                                                 "similarity_boost": 0.8, "use_speaker_boost": True}})
    h.send({"text": " ", "context_id": "c2", "voice_settings": {"style": 0.9, "speed": 0.7}})
    h.send({"text": " ", "context_id": "c3", "voice_settings": {"style": 0.0}})
    for cid in ("c1", "c2", "c3"):
        h.send({"text": "Hello there. ", "context_id": cid, "flush": True})
        h.send({"context_id": cid, "close_context": True})
    h.finish(6)
    out = h.deliver()
    assert [elevenlabs_samples(out, c) for c in ("c1", "c2", "c3")] == [
        round(6 * FRAME_SAMPLES / 1.2), round(6 * FRAME_SAMPLES / 0.7), 6 * FRAME_SAMPLES]
    assert [p.instructions for p in params(h)] == [None, "Speak very expressively, with exaggerated emotion.", None]
    # the alignment estimate runs at the context's speed: its characters end within the faster audio
    spans = [m["alignment"] for m in jsons(out) if m.get("alignment") and m.get("contextId") == "c1"]
    assert sum(s["charStartTimesMs"][-1] + s["charDurationsMs"][-1] for s in spans) <= 6 * 80 / 1.2 + 1


def test_elevenlabs_stream_input_first_message_settings(tokenizer):
    h = elevenlabs(tokenizer, multi=False, query={"sync_alignment": "true", "auto_mode": "true",
                                                  "apply_text_normalization": "off", "enable_ssml_parsing": "false"})
    h.send({"text": " ", "voice_settings": {"speed": 0.8},
            "generation_config": {"chunk_length_schedule": [120, 160, 250, 290]}})
    h.send({"text": "Hello there. ", "try_trigger_generation": True})
    (ctx,) = h.opened()
    assert h.text_ids(ctx)          # streamed before the schedule's 120 characters
    h.send({"text": ""})
    h.finish(4)
    out = h.deliver()
    assert elevenlabs_samples(out) == round(4 * FRAME_SAMPLES / 0.8) and jsons(out)[-1] == {"isFinal": True}


@pytest.mark.parametrize("msg, code", [
    ({"voice_settings": {"speed": 1.5}}, "invalid_voice_settings"),
    ({"voice_settings": {"stability": 2}}, "invalid_voice_settings"),
    ({"voice_settings": {"style": "a lot"}}, "invalid_voice_settings"),
    ({"voice_settings": {"use_speaker_boost": 1}}, "invalid_voice_settings"),
    ({"generation_config": {"chunk_length_schedule": [10]}}, "invalid_generation_config"),
    ({"generation_config": {"chunk_length_schedule": "120"}}, "invalid_generation_config"),
])
def test_elevenlabs_bad_settings_are_elevenlabs_errors(tokenizer, msg, code):
    h = elevenlabs(tokenizer)
    h.send({"text": " ", "context_id": "c1", **msg})
    (err,) = h.queued()
    assert err == {"message": err["message"], "error": code, "code": 1008, "contextId": "c1"} and h.live() == []


@pytest.mark.parametrize("query", [{"sync_alignment": "yes"}, {"auto_mode": "1"}, {"enable_ssml_parsing": "maybe"},
                                   {"apply_text_normalization": "sometimes"}])
def test_elevenlabs_bad_query_closes(tokenizer, query):
    h = elevenlabs(tokenizer, query)
    (err,) = h.queued()
    assert err["error"] == "invalid_request" and h.close.code == 1008


def test_elevenlabs_style_refused_on_base(tokenizer):
    h = elevenlabs(tokenizer, models=BASE)
    h.send({"text": " ", "context_id": "c1", "voice_settings": {"style": 0.5}})
    h.send({"text": "Hello. ", "context_id": "c1"})
    err = jsons(h.queued())
    assert err[0]["error"] == "expression_unsupported" and err[-1] == {"isFinal": True, "contextId": "c1"}


def test_elevenlabs_http_voice_settings():
    from talkgate.sessions.elevenlabs import parse_http_request
    from talkgate.sessions.fields import SessionError
    from tests.compat_harness import ONE_MODEL
    voices = VoiceMap({"elevenlabs": {"v1": None}})
    _, cfg, _ = parse_http_request("v1", {}, {"text": "Hi.", "voice_settings": {"speed": 1.1, "style": 0.5},
                                              "previous_text": "Before.", "next_text": "After.",
                                              "apply_text_normalization": "on"}, ONE_MODEL, voices, 100)
    assert cfg.speed == 1.1 and cfg.expression == ("Speak expressively.",)
    for body in ({"voice_settings": {"speed": 0.5}}, {"apply_text_normalization": "always"}, {"previous_text": 3}):
        with pytest.raises(SessionError):
            parse_http_request("v1", {}, {"text": "Hi.", **body}, ONE_MODEL, voices, 100)


# ----- Deepgram -----
def test_deepgram_v1_socket_speed(tokenizer):
    from talkgate.sessions.deepgram import DeepgramProtocol
    voices = VoiceMap({"deepgram": {"aura-test": None}})
    h = Harness(tokenizer, lambda s: DeepgramProtocol(s, "s1", {"model": "aura-test", "speed": "1.25"}, voices))
    h.ready()
    h.send({"type": "Speak", "text": "Hello there."})
    h.send({"type": "Close"})
    h.finish(5)
    audio = b"".join(m for m in h.deliver() if isinstance(m, bytes))
    assert len(audio) == 2 * round(5 * FRAME_SAMPLES / 1.25) and h.close.code == 1000


@pytest.mark.parametrize("speed, code", [("2", "SPEED_OUT_OF_RANGE"), ("0.5", "SPEED_OUT_OF_RANGE"),
                                         ("fast", "SPEED_OUT_OF_RANGE")])
def test_deepgram_v1_bad_speed(tokenizer, speed, code):
    from talkgate.sessions.deepgram import DeepgramProtocol, parse_rest_request
    from talkgate.sessions.fields import SessionError
    from tests.compat_harness import ONE_MODEL
    voices = VoiceMap({"deepgram": {"aura-test": None}})
    h = Harness(tokenizer, lambda s: DeepgramProtocol(s, "s1", {"model": "aura-test", "speed": speed}, voices))
    h.ready()
    assert h.close.code == 1008 and h.close.reason.startswith(code)
    with pytest.raises(SessionError) as e:
        parse_rest_request({"model": "aura-test", "speed": speed}, {"text": "Hi."}, ONE_MODEL, voices)
    assert e.value.code == code
    assert parse_rest_request({"model": "aura-test", "speed": "0.7"}, {"text": "Hi."}, ONE_MODEL,
                              voices)[2].speed == 0.7


def test_deepgram_flux_expressivity_is_an_instruction():
    from talkgate.sessions.deepgram_v2 import parse_query
    from talkgate.sessions.fields import SessionError
    from tests.compat_harness import ONE_MODEL
    voices = VoiceMap({"deepgram": {"flux-test-en": None}})
    assert parse_query({"model": "flux-test-en", "expressivity": "2"}, ONE_MODEL, voices).expression == (
        "Speak very expressively, animated.",)
    assert parse_query({"model": "flux-test-en", "expressivity": "0"}, BASE, voices).expression == ()
    with pytest.raises(SessionError) as e:
        parse_query({"model": "flux-test-en", "expressivity": "-1"}, BASE, voices)
    assert e.value.code == "EXPRESSIVITY_UNSUPPORTED"


# ----- DashScope -----
def test_dashscope_volume_is_a_gain(tokenizer):
    from talkgate.sessions.dashscope import DashScopeProtocol
    for volume, gain in ((50, 1.0), (100, 2.0), (0, 0.0), (25, 0.5)):
        h = Harness(tokenizer, lambda s: DashScopeProtocol(s, "s1", "qwen-tts-realtime", VoiceMap()))
        h.ready()
        h.send({"type": "session.update", "session": {"volume": volume, "response_format": "pcm"}})
        h.send({"type": "input_text_buffer.append", "text": "Hello."})
        h.send({"type": "session.finish"})
        h.finish(2)
        out = [m for m in h.deliver() if m["type"] == "response.audio.delta"]
        got = np.frombuffer(b"".join(base64.b64decode(m["delta"]) for m in out), np.int16)
        want = np.clip(gain * np.concatenate([pcm(0), pcm(1)]), -1, 1)
        assert np.abs(got / 32767 - want).max() < 1e-3, volume


# ----- SSML (ElevenLabs enable_ssml_parsing) -----
def test_ssml_reader_subset_across_deltas():
    from talkgate.sessions.ssml import Pause, Rate, SsmlError, SsmlReader
    r = SsmlReader()
    items = [i for part in ('<speak>Call &amp; <brea', 'k time="1.5s"/><break strength="weak"/>now, ',
                            '<prosody rate="slow">code <say-as interpret-as="characters">AB1</say-as>',
                            '<prosody rate="50%">x</prosody></prosody> done.</speak>') for i in r.feed(part)]
    assert items == ["Call & ", Pause(1700.0), "now, ", Rate(0.8), "code  A B 1 ", Rate(0.4), "x", Rate(0.8),
                     Rate(1.0), " done."]
    assert r.finish() == []
    for bad in ('<phoneme alphabet="ipa" ph="x">a</phoneme>', '<break time="9s"/>', '<prosody rate="5%">',
                '<say-as interpret-as="date">1/2</say-as>', '</prosody>', '<prosody pitch="high">'):
        with pytest.raises(SsmlError):
            SsmlReader().feed(bad)
    r = SsmlReader()
    r.feed("open <say-as interpret-as=\"digits\">12")
    with pytest.raises(SsmlError):
        r.finish()


def test_elevenlabs_ssml_break_is_silence_and_rate_is_tempo(tokenizer):
    from talkgate.synth.api import AppendText, FlushText
    h = elevenlabs(tokenizer, {"enable_ssml_parsing": "true"})
    h.send({"text": " ", "context_id": "c1"})
    h.send({"text": 'One <break time="500ms"/>two <prosody rate="50%">three</prosody>', "context_id": "c1",
            "flush": True})
    (ctx,) = h.opened()
    text = tokenizer.decode(h.text_ids(ctx))
    assert text.replace(" ", "") == "Onetwothree" and "<" not in text
    assert [type(c) for c in h.commands if isinstance(c, (AppendText, FlushText))].count(FlushText) == 3
    for _ in range(3):                      # each segment: 2 frames, then its flush's end
        h.answer(ctx, 2)
    out = h.deliver()
    # "One ", 500 ms of silence, "two ", "three" at half speed (the client's flush adds nothing: the last
    # </prosody> rides on the flush before it)
    assert elevenlabs_samples(out) == 2 * FRAME_SAMPLES + 12000 + 2 * FRAME_SAMPLES + round(2 * FRAME_SAMPLES / 0.5)
    h.send({"text": "four", "context_id": "c1", "flush": True})
    h.answer(ctx, 2)
    assert elevenlabs_samples(h.deliver()) == 2 * FRAME_SAMPLES      # at the context's own speed again
    audio = np.frombuffer(b"".join(base64.b64decode(m["audio"]) for m in jsons(out) if m.get("audio")), np.int16)
    assert not audio[2 * FRAME_SAMPLES:2 * FRAME_SAMPLES + 12000].any()
    h.send({"text": "<phoneme ph='x'>a</phoneme>", "context_id": "c1"})
    (err,) = h.queued()
    assert err["error"] == "invalid_ssml" and err["contextId"] == "c1"
    # without enable_ssml_parsing, tags are text
    h = elevenlabs(tokenizer)
    h.send({"text": 'One <break time="500ms"/>', "context_id": "c1", "flush": True})
    assert tokenizer.decode(h.text_ids(h.opened()[0])) == 'One <break time="500ms"/>'


def test_http_alignment_at_the_speed(tokenizer):
    """ElevenLabs with-timestamps: the estimate speaks the characters at the request's speed, so all of them are
    placed within the shorter audio (none left over at its end)."""
    import json

    from talkgate.sessions.elevenlabs import ElevenLabsSpeech, parse_http_request
    from talkgate.sessions.http import Respond
    from talkgate.sessions.limits import Limits
    from talkgate.sessions.session import Session
    from talkgate.synth.api import AudioChunk, ContextDone
    from talkgate.synth.tokenizer import StreamingTokenizer
    from tests.compat_harness import ONE_MODEL
    text = "Hi there, you ok"          # 16 characters: 1.14 s at 14 a second, 0.95 s at speed 1.2
    _, cfg, output = parse_http_request("v1", {"output_format": "pcm_24000"}, {
        "text": text, "voice_settings": {"speed": 1.2}}, ONE_MODEL, VoiceMap({"elevenlabs": {"v1": None}}), 100)
    s = Session(INFO, Limits(), lambda: StreamingTokenizer(tokenizer), defaults=cfg)
    proto = ElevenLabsSpeech(s, text, output, timestamps=True, streamed=False)
    proto.start()
    (ctx,) = [c.context for c in proto.engine_commands() if isinstance(c, OpenContext)]
    proto.speak()
    for i in range(15):                 # 1.2 s of audio made, 1 s delivered
        proto.engine_event(AudioChunk(ctx, pcm(i), i, 1, 0.0))
    (answer,) = [a for a in proto.engine_event(ContextDone(ctx, "eos", 15)) if isinstance(a, Respond)]
    alignment = json.loads(answer.body)["alignment"]
    ends = alignment["character_end_times_seconds"]
    assert "".join(alignment["characters"]) == text and ends[-1] <= 1.0 + 1e-3
    assert all(e > s for s, e in zip(alignment["character_start_times_seconds"], ends))   # each has a duration
