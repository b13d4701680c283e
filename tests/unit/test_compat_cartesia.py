"""Cartesia /tts/websocket translator, Sans-I/O: messages in, engine commands and wire messages out,
engine events built in the test (tests/compat_harness.py)."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from talkgate.sessions.actions import Purge
from talkgate.sessions.cartesia import CartesiaProtocol
from talkgate.sessions.limits import Limits
from talkgate.sessions.voices import VoiceMap
from talkgate.synth.api import CancelContext
from tests.compat_harness import INFO, Harness, jsons

VOICE = "11111111-2222-3333-4444-555555555555"
F32 = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}


def make(tokenizer):
    voices = VoiceMap({"cartesia": {VOICE: INFO.voices[0]}})
    h = Harness(tokenizer, lambda s: CartesiaProtocol(s, "s1", voices))
    assert h.ready() == []
    return h


def request(cid, transcript, cont=True, **extra):
    return {"context_id": cid, "model_id": "sonic-2", "transcript": transcript, "continue": cont,
            "voice": {"mode": "id", "id": VOICE}, "output_format": F32, "language": "en", **extra}


def test_continued_context_chunks_timestamps_done(tokenizer):
    h = make(tokenizer)
    h.send(request("c1", "Hello ", add_timestamps=True))
    h.send(request("c1", "world. ", add_timestamps=True))
    h.send(request("c1", "", cont=False, add_timestamps=True))
    h.finish(8)
    out = jsons(h.deliver())
    assert all(m["context_id"] == "c1" and m["type"] in ("chunk", "timestamps", "done") for m in out)
    assert out[-1] == {"type": "done", "done": True, "status_code": 206, "context_id": "c1"}
    chunks = [m for m in out if m["type"] == "chunk"]
    assert chunks and all(m["done"] is False and m["status_code"] == 206 for m in chunks)
    pcm = np.frombuffer(b"".join(base64.b64decode(m["data"]) for m in chunks), np.float32)
    assert len(pcm) % 1920 == 0 and np.isfinite(pcm).all()
    stamps = [m["word_timestamps"] for m in out if m["type"] == "timestamps"]
    words = [w for s in stamps for w in s["words"]]
    starts = [t for s in stamps for t in s["start"]]
    ends = [t for s in stamps for t in s["end"]]
    assert words == ["Hello", "world."]
    assert starts == sorted(starts) and all(e >= s for s, e in zip(starts, ends))
    assert ends[-1] <= len(pcm) / 24000 + 1e-3


def test_no_timestamps_unless_asked(tokenizer):
    h = make(tokenizer)
    h.send(request("c", "Hi there. ", cont=False))
    h.finish()
    assert {m["type"] for m in jsons(h.deliver())} == {"chunk", "done"}


def test_flush_done_in_order_then_more_text(tokenizer):
    h = make(tokenizer)
    h.send(request("c", "First. ", flush=True))
    h.send(request("c", "Second. ", cont=False))
    h.finish()
    types = [m["type"] for m in jsons(h.deliver())]
    fd = types.index("flush_done")
    assert "chunk" in types[:fd] and "chunk" in types[fd:] and types[-1] == "done"


def test_cancel_purges_and_nothing_follows(tokenizer):
    h = make(tokenizer)
    h.send(request("c", "A sentence long enough to be cancelled in the middle. "))
    (ctx,) = h.opened()
    h.audio(ctx, 2)
    actions = h.send({"context_id": "c", "cancel": True})
    assert any(isinstance(a, Purge) for a in actions) and h.queued() == []
    assert h.commands[-1] == CancelContext(ctx)
    h.audio(ctx, 2)
    assert h.queued() == []
    assert h.send({"context_id": "c", "cancel": True}) == []     # already over: nothing


def test_nothing_after_done_and_context_id_reuse(tokenizer):
    h = make(tokenizer)
    h.send(request("c", "Hi. ", cont=False))
    h.finish()
    out = jsons(h.deliver())
    assert out[-1]["type"] == "done"
    h.audio(h.opened()[0], 1)
    assert h.queued() == []
    h.send(request("c", "Again. ", cont=False))          # a new context under the same id
    h.finish()
    assert jsons(h.deliver())[-1]["type"] == "done" and len(h.opened()) == 2


def test_mulaw_8k(tokenizer):
    h = make(tokenizer)
    h.send({**request("c", "Hi. ", cont=False), "output_format":
            {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000}})
    h.finish()
    data = b"".join(base64.b64decode(m["data"]) for m in jsons(h.deliver()) if m["type"] == "chunk")
    assert data and len(data) % 640 == 0


@pytest.mark.parametrize("msg, code", [
    ("{oops", "invalid_json"),
    ({"transcript": "hi"}, "invalid_message"),                                  # no context_id
    ({**request("c", "hi"), "voice": {"mode": "id", "id": "unknown-voice"}}, "voice_not_found"),
    ({**request("c", "hi"), "voice": {"mode": "embedding", "embedding": [0.1]}}, "invalid_voice"),
    ({**request("c", "hi"), "output_format": {"container": "mp3", "encoding": "mp3", "sample_rate": 44100}},
     "invalid_output_format"),
    ({**request("c", "hi"), "output_format": {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 16000}},
     "invalid_output_format"),
    ({**request("c", "hi"), "continue": "yes"}, "invalid_message"),
    ({**request("c", "hi"), "voice": {}}, "invalid_voice"),
    ({**request("c", "hi"), "voice": {"mode": "id", "id": ""}}, "invalid_voice"),
    ({**request("c", "hi"), "output_format": {**F32, "sample_rate": 24000.0}}, "invalid_output_format"),
    ({**request("c", "hi"), "output_format": {**F32, "encoding": ["pcm_f32le"]}}, "invalid_output_format"),
])
def test_errors_carry_context_id_and_type(tokenizer, msg, code):
    h = make(tokenizer)
    h.send(msg)
    (err,) = h.queued()
    assert err["type"] == "error" and err["error_code"] == code and err["done"] is True
    assert "context_id" in err and err["title"] and err["message"] and err["status_code"] == 400
    assert h.live() == []


def test_error_on_a_running_context_ends_it(tokenizer):
    h = make(tokenizer)
    h.send(request("c", "Some words to say here. "))
    (ctx,) = h.opened()
    h.audio(ctx, 2)
    actions = h.send({"context_id": "c", "transcript": 7})
    assert any(isinstance(a, Purge) for a in actions) and h.commands[-1] == CancelContext(ctx)
    assert [m["type"] for m in h.queued()] == ["error"]
    h.audio(ctx, 2)
    assert [m["type"] for m in h.queued()] == ["error"]


def test_engine_failure_is_a_server_error_and_a_refusal_is_not_a_500(tokenizer):
    h = make(tokenizer)
    h.send(request("a", "Hi. "))
    h.send(request("b", "Hi. "))
    a, b = h.opened()
    h.fail(a, "engine_full", "no free slot")
    h.fail(b, "engine_error", "the step failed")
    statuses = {m["context_id"]: m["status_code"] for m in h.queued()}
    assert statuses == {"a": 429, "b": 500}


def test_contexts_per_connection(tokenizer):
    h = Harness(tokenizer, lambda s: CartesiaProtocol(s, "s1", VoiceMap({"cartesia": {VOICE: None}})),
                Limits(max_contexts_per_connection=3))
    for cid in "abcd":
        h.send(request(cid, ""))            # an empty transcript opens the context too
    (err,) = h.queued()
    assert err["error_code"] == "too_many_contexts" and err["context_id"] == "d"


def test_idle_socket_closes(tokenizer):
    """The connection decides when a socket is idle (no message, no audio taken); the protocol closes it."""
    h = make(tokenizer)
    h.send(request("c", "Some words. "))
    h.apply(h.proto.idle_timeout())
    assert h.close.code == 1000 and h.live() == []          # and its contexts end
