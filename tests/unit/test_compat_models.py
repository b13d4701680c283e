"""Model-name routing on every compatible protocol (issue 46), Sans-I/O: a served model named in the protocol's own
model field (ElevenLabs and Cartesia `model_id`, Deepgram `model` as `NAME:<deepgram model>`, DashScope's `model`,
Twilio's native session.config) opens its contexts on that model's engine (OpenContext.model) with that model's
voices; the vendor's own model names stay the default's; an unknown name is refused in the protocol's own shape."""
from __future__ import annotations

import pytest

from talkgate.sessions import cartesia, deepgram, deepgram_v2, elevenlabs
from talkgate.sessions.cartesia import CartesiaProtocol
from talkgate.sessions.dashscope import DashScopeProtocol
from talkgate.sessions.deepgram import DeepgramProtocol
from talkgate.sessions.elevenlabs import ElevenLabsProtocol
from talkgate.sessions.fields import SessionError
from talkgate.sessions.limits import Limits
from talkgate.sessions.native import NativeProtocol
from talkgate.sessions.twilio import TwilioProtocol
from talkgate.sessions.voices import VoiceMap
from talkgate.synth.api import OpenContext
from tests.compat_harness import INFO, TWO_MODELS, Harness, jsons

VOICES = VoiceMap()
CARTESIA_F32 = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}


def opened(h: Harness) -> list[OpenContext]:
    return [c for c in h.commands if isinstance(c, OpenContext)]


def harness(tokenizer, make) -> Harness:
    return Harness(tokenizer, make, models=TWO_MODELS)


# ----- ElevenLabs -----
def elevenlabs_ws(tokenizer, model_id: str, voice_id: str) -> Harness:
    h = harness(tokenizer, lambda s: ElevenLabsProtocol(s, "s1", voice_id, {"output_format": "pcm_16000",
                                                                              "model_id": model_id}, VOICES, True))
    h.ready()
    return h


@pytest.mark.parametrize("model_id, voice_id, model, voice", [
    ("other", "solo", "other", "solo"), ("OTHER", "solo", "other", "solo"),
    ("eleven_flash_v2_5", "ryan", None, "ryan"), ("tiny", "ryan", None, "ryan")])
def test_elevenlabs_socket_model_id(tokenizer, model_id, voice_id, model, voice):
    h = elevenlabs_ws(tokenizer, model_id, voice_id)
    h.send({"text": "Hi there. ", "context_id": "c1", "flush": True})
    (ctx,) = opened(h)
    assert (ctx.model, ctx.params.voice) == (model, voice)


def test_elevenlabs_socket_voice_of_another_model_or_unknown_model_is_refused(tokenizer):
    h = elevenlabs_ws(tokenizer, "other", "ryan")      # ryan is the default's, not other's
    assert jsons(h.deliver())[0]["error"] == "voice_not_found" and h.close.code == 1008
    h = elevenlabs_ws(tokenizer, "no-such-model", "ryan")
    (error,) = jsons(h.deliver())
    assert error["error"] == "unknown_model" and "tiny, other" in error["message"] and h.close.code == 1008


def test_elevenlabs_http_model_id():
    _, config, _ = elevenlabs.parse_http_request("solo", {}, {"text": "Hi.", "model_id": "other"}, TWO_MODELS,
                                                 VOICES, 100)
    assert (config.model, config.voice) == ("other", "solo")
    _, config, _ = elevenlabs.parse_http_request("ryan", {}, {"text": "Hi.", "model_id": "eleven_v3"}, TWO_MODELS,
                                                 VOICES, 100)
    assert config.model == "eleven_v3" and TWO_MODELS.route(config.model) is TWO_MODELS.default
    with pytest.raises(SessionError) as e:
        elevenlabs.parse_http_request("ryan", {}, {"text": "Hi.", "model_id": "nope"}, TWO_MODELS, VOICES, 100)
    assert e.value.code == "unknown_model"


# ----- Cartesia -----
def cartesia_request(cid: str, model_id: str, voice: str) -> dict:
    return {"context_id": cid, "model_id": model_id, "transcript": "Hi there.", "continue": False,
            "voice": {"mode": "id", "id": voice}, "output_format": CARTESIA_F32}


def test_cartesia_socket_model_id_per_context(tokenizer):
    h = harness(tokenizer, lambda s: CartesiaProtocol(s, "s1", VOICES))
    h.send(cartesia_request("a", "other", "solo"))
    h.send(cartesia_request("b", "sonic-2", "ryan"))
    h.send(cartesia_request("c", "nope", "ryan"))
    assert [(c.model, c.params.voice) for c in opened(h)] == [("other", "solo"), (None, "ryan")]
    (error,) = [m for m in jsons(h.deliver()) if m["type"] == "error"]
    assert (error["context_id"], error["error_code"], error["status_code"], error["done"]) == (
        "c", "unknown_model", 400, True)


def test_cartesia_http_model_id():
    body = {"transcript": "Hi.", "voice": {"mode": "id", "id": "solo"}, "output_format": CARTESIA_F32}
    _, config, _ = cartesia.parse_http_request({**body, "model_id": "other"}, TWO_MODELS, VOICES, 100, False)
    assert (config["model"], config["voice"]) == ("other", "solo")
    with pytest.raises(SessionError) as e:
        cartesia.parse_http_request({**body, "model_id": "nope"}, TWO_MODELS, VOICES, 100, False)
    assert e.value.code == "unknown_model"


# ----- Deepgram: a served model named before Deepgram's model, NAME:aura-... -----
@pytest.mark.parametrize("model, served, voice", [
    ("other:solo", "other", "solo"), ("tiny:ryan", "tiny", "ryan"), ("ryan", None, "ryan"), ("solo", None, "solo")])
def test_deepgram_served_model(model, served, voice):
    assert deepgram.served_model(model, TWO_MODELS, VOICES) == (served, voice)


def test_deepgram_socket_model_prefix(tokenizer):
    h = harness(tokenizer, lambda s: DeepgramProtocol(s, "s1", {"model": "other:solo"}, VOICES))
    h.ready()
    h.send({"type": "Speak", "text": "Hi there."})
    h.send({"type": "Flush"})
    (ctx,) = opened(h)
    assert (ctx.model, ctx.params.voice) == ("other", "solo")
    h = harness(tokenizer, lambda s: DeepgramProtocol(s, "s1", {"model": "nope:aura-2-thalia-en"}, VOICES))
    h.ready()
    assert h.close.code == 1008 and h.close.reason.startswith("INVALID_MODEL")


def test_deepgram_rest_and_flux_model_prefix():
    _, model, config = deepgram.parse_rest_request({"model": "other:solo"}, {"text": "Hi."}, TWO_MODELS, VOICES)
    assert (model, config.model, config.voice) == ("other:solo", "other", "solo")
    settings = deepgram_v2.parse_query({"model": "other:solo"}, TWO_MODELS, VOICES)
    assert (settings.model, settings.served_model, settings.voice) == ("other:solo", "other", "solo")
    for parse in (lambda: deepgram.parse_rest_request({"model": "nope:x"}, {"text": "Hi."}, TWO_MODELS, VOICES),
                  lambda: deepgram_v2.parse_query({"model": "nope:x"}, TWO_MODELS, VOICES)):
        with pytest.raises(SessionError) as e:
            parse()
        assert e.value.code == "INVALID_MODEL" and "tiny, other" in e.value.message


# ----- DashScope: the socket's ?model= -----
def dashscope(tokenizer, model: str, voice: str) -> Harness:
    h = harness(tokenizer, lambda s: DashScopeProtocol(s, "s1", model, VOICES))
    h.ready()
    h.send({"type": "session.update", "event_id": "e1", "session": {"voice": voice}})
    return h


@pytest.mark.parametrize("model, voice, served", [
    ("other", "solo", "other"), ("qwen-tts-realtime", "ryan", None), ("qwen3-tts-flash-realtime", "ryan", None)])
def test_dashscope_model(tokenizer, model, voice, served):
    h = dashscope(tokenizer, model, voice)
    h.send({"type": "input_text_buffer.append", "event_id": "e2", "text": "Hi there."})
    h.send({"type": "input_text_buffer.commit", "event_id": "e3"})
    (ctx,) = opened(h)
    assert (ctx.model, ctx.params.voice) == (served, voice)


def test_dashscope_unknown_model_is_its_error_event_and_a_close(tokenizer):
    h = harness(tokenizer, lambda s: DashScopeProtocol(s, "s1", "nope", VOICES))
    h.ready()
    (error,) = jsons(h.deliver())
    assert error["type"] == "error" and error["error"]["code"] == "unknown_model"
    assert error["error"]["param"] == "model" and h.close.code == 1008


# ----- Twilio: the bridge names the model in its native session.config (or a context.start) -----
def test_twilio_session_config_model(tokenizer):
    limits = Limits(max_text_chars=400, max_backlog_ms=60_000)
    h = Harness(tokenizer, lambda s: TwilioProtocol(NativeProtocol(s, limits, "s1"), "MZ1"), limits,
                models=TWO_MODELS)
    h.ready()
    h.send({"type": "session.config", "model": "other", "voice": "solo"})
    h.send({"type": "text", "context_id": "u1", "text": "Hello caller."})
    h.send({"type": "context.start", "context_id": "u2", "model": "tiny", "voice": "ryan"})
    assert [(c.model, c.params.voice) for c in opened(h)] == [("other", "solo"), (None, "ryan")]
    h.send({"type": "context.start", "context_id": "u3", "model": "nope"})
    assert [m["code"] for m in jsons(h.deliver()) if m.get("type") == "error"] == ["unknown_model"]


def test_one_model_server_is_unchanged(tokenizer):
    h = Harness(tokenizer, lambda s: CartesiaProtocol(s, "s1", VOICES))
    h.send(cartesia_request("a", "sonic-2", INFO.voices[0]))
    assert [c.model for c in opened(h)] == [None]


@pytest.mark.parametrize("name, served", [
    ("qwen3-tts", "tiny"), ("Qwen3-TTS-Flash", "tiny"), ("Qwen/Qwen3-TTS-12Hz-1.7B-Base", "tiny"),
    ("qwen-tts-realtime", "tiny"), ("other", "other"), ("SomeOrg/other", "other"), ("tts-1", "tiny")])
def test_qwen_names_and_hugging_face_ids(name, served):
    """Qwen's own model names alias the default (README's OpenAI example sends qwen3-tts); a Hugging Face id names
    the served model of its last part."""
    assert TWO_MODELS.named(name).name == served


@pytest.mark.parametrize("name", ["qwen3", "whisper-1", "other/x"])
def test_other_names_are_unknown(name):
    with pytest.raises(SessionError) as e:
        TWO_MODELS.named(name)
    assert e.value.code == "unknown_model"
