"""Cartesia /tts/websocket translator, Sans-I/O, on the real tiny engine."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from talkgate.sessions.cartesia import CartesiaProtocol
from talkgate.sessions.native import Purge
from talkgate.sessions.voices import VoiceMap
from tests.compat_harness import Harness, jsons

VOICE = "11111111-2222-3333-4444-555555555555"
F32 = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}


def make(engine):
    voices = VoiceMap({"cartesia": {VOICE: engine.info.voices[0] if engine.info.voices else None}})
    h = Harness(engine, lambda s: CartesiaProtocol(s, "s1", voices))
    assert h.ready() == []
    return h


def request(cid, transcript, cont=True, **extra):
    return {"context_id": cid, "model_id": "sonic-2", "transcript": transcript, "continue": cont,
            "voice": {"mode": "id", "id": VOICE}, "output_format": F32, "language": "en", **extra}


def test_continued_context_chunks_timestamps_done(tiny_engine):
    h = make(tiny_engine)
    h.send(request("c1", "Hello ", add_timestamps=True))
    h.send(request("c1", "world. ", add_timestamps=True))
    h.send(request("c1", "", cont=False, add_timestamps=True))
    h.pump(lambda m: m["type"] == "done")
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


def test_no_timestamps_unless_asked(tiny_engine):
    h = make(tiny_engine)
    h.send(request("c", "Hi there. ", cont=False))
    h.pump(lambda m: m["type"] == "done")
    assert {m["type"] for m in jsons(h.deliver())} == {"chunk", "done"}


def test_flush_done_in_order_then_more_text(tiny_engine):
    h = make(tiny_engine)
    h.send(request("c", "First. ", flush=True))
    h.send(request("c", "Second. ", cont=False))
    h.pump(lambda m: m["type"] == "done")
    types = [m["type"] for m in jsons(h.deliver())]
    fd = types.index("flush_done")
    assert "chunk" in types[:fd] and "chunk" in types[fd:] and types[-1] == "done"


def test_cancel_purges_and_nothing_follows(tiny_engine):
    h = make(tiny_engine)
    h.send(request("c", "A sentence long enough to be cancelled in the middle. "))
    h.pump(lambda m: m["type"] == "chunk")
    actions = h.send({"context_id": "c", "cancel": True})
    assert any(isinstance(a, Purge) for a in actions) and h.queued() == []
    h.pump_all()
    assert h.queued() == []
    assert h.send({"context_id": "c", "cancel": True}) == []     # already over: nothing


def test_nothing_after_done_and_context_id_reuse(tiny_engine):
    h = make(tiny_engine)
    h.send(request("c", "Hi. ", cont=False))
    h.pump(lambda m: m["type"] == "done")
    h.pump_all(0.2)
    out = jsons(h.deliver())
    assert out[-1]["type"] == "done"
    h.send(request("c", "Again. ", cont=False))          # a new context under the same id
    h.pump(lambda m: m["type"] == "done")
    assert jsons(h.deliver())[-1]["type"] == "done"


def test_mulaw_8k(tiny_engine):
    h = make(tiny_engine)
    h.send({**request("c", "Hi. ", cont=False), "output_format":
            {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000}})
    h.pump(lambda m: m["type"] == "done")
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
])
def test_errors_carry_context_id_and_type(tiny_engine, msg, code):
    h = make(tiny_engine)
    h.send(msg)
    (err,) = h.queued()
    assert err["type"] == "error" and err["error_code"] == code and err["done"] is True
    assert "context_id" in err and err["title"] and err["message"]


def test_error_on_a_running_context_ends_it(tiny_engine):
    h = make(tiny_engine)
    h.send(request("c", "Some words to say here. "))
    h.pump(lambda m: m["type"] == "chunk")
    actions = h.send({"context_id": "c", "transcript": 7})
    assert any(isinstance(a, Purge) for a in actions)
    assert [m["type"] for m in h.queued()] == ["error"]
    h.pump_all()
    assert [m["type"] for m in h.queued()] == ["error"]


def test_idle_socket_closes(tiny_engine):
    """The connection decides when a socket is idle (no message, no audio taken); the protocol closes it."""
    h = make(tiny_engine)
    h.send(request("c", "Some words. "))
    assert h.proto.idle_timeout()[-1].code == 1000
