"""Twilio Media Streams mode: native messages in, Twilio media/mark/clear frames out (Sans-I/O, engine
events built in the test)."""
from __future__ import annotations

import base64

from talkgate.sessions.actions import Purge
from talkgate.sessions.limits import Limits
from talkgate.sessions.native import NativeProtocol
from talkgate.sessions.twilio import TwilioProtocol
from talkgate.synth.api import CancelContext
from tests.compat_harness import Harness, jsons

SID = "MZ0123456789abcdef"


def make(tokenizer):
    limits = Limits(max_text_chars=400, max_backlog_ms=60_000)
    h = Harness(tokenizer, lambda s: TwilioProtocol(NativeProtocol(s, limits, "s1"), SID), limits)
    h.ready()
    (ready,) = h.queued()
    assert ready["type"] == "session.ready"
    assert ready["config"]["format"] == {"encoding": "mulaw", "sample_rate": 8000}
    h.deliver()
    return h


def media_payloads(msgs):
    return [base64.b64decode(m["media"]["payload"]) for m in msgs if m.get("event") == "media"]


def test_context_becomes_160_byte_media_frames_then_mark(tokenizer):
    h = make(tokenizer)
    h.send({"type": "text", "context_id": "u1", "text": "Hello caller."})
    h.send({"type": "flush", "context_id": "u1"})
    h.finish(3)
    out = jsons(h.deliver())
    frames = [m for m in out if "event" in m]
    assert all(m["streamSid"] == SID for m in frames)
    payloads = media_payloads(frames)
    assert payloads and all(len(p) == 160 for p in payloads)
    assert frames[-1] == {"event": "mark", "streamSid": SID, "mark": {"name": "u1"}}
    kinds = [m.get("event") or m.get("type") for m in out]
    assert kinds.index("mark") < kinds.index("context.done")       # native event after the mark
    done = next(m for m in out if m.get("type") == "context.done")
    assert abs(len(payloads) * 20 - done["audio_ms"]) < 20          # padded to whole 20 ms frames


def test_contexts_play_in_order(tokenizer):
    h = make(tokenizer)
    for cid, text in (("a", "First sentence here."), ("b", "Second one.")):
        h.send({"type": "text", "context_id": cid, "text": text})
        h.send({"type": "flush", "context_id": cid})
    a, b = h.opened()
    h.speak(b, 2)                       # b is done before a: its audio is held until a's mark
    h.speak(a, 3)
    frames = [m for m in jsons(h.deliver()) if "event" in m]
    marks = [i for i, m in enumerate(frames) if m["event"] == "mark"]
    assert [frames[i]["mark"]["name"] for i in marks] == ["a", "b"]
    assert media_payloads(frames[:marks[0]]) and media_payloads(frames[marks[0]:marks[1]])


def test_cancel_clears_twilio_buffer(tokenizer):
    h = make(tokenizer)
    h.send({"type": "context.start", "context_id": "u", "fixed_frames": 200})
    h.send({"type": "text", "context_id": "u", "text": "Talking for a while now."})
    h.send({"type": "flush", "context_id": "u"})
    (ctx,) = h.opened()
    h.audio(ctx, 2)
    h.deliver()
    actions = h.send({"type": "cancel", "context_id": "u"})
    assert any(isinstance(a, Purge) for a in actions) and h.commands[-1] == CancelContext(ctx)
    queued = h.queued()
    assert queued[0] == {"event": "clear", "streamSid": SID} and queued[1]["type"] == "context.cancelled"
    h.audio(ctx, 2)
    assert [m for m in h.queued() if m.get("event") == "media"] == []


def test_format_cannot_be_changed(tokenizer):
    h = make(tokenizer)
    h.send({"type": "session.config", "format": {"encoding": "opus", "sample_rate": 48000}})
    assert h.queued()[-1]["code"] == "invalid_format"
    h.send({"type": "session.config", "audio_transport": "base64"})
    assert h.queued()[-1]["code"] == "invalid_format"
    h.send("{bad json")
    assert h.queued()[-1]["code"] == "invalid_json"
