"""The native protocol and session model, Sans-I/O: messages in, actions out, no sockets.

The engine is the real one (tiny checkpoint, CPU, its own thread); its events are collected from
the sink and fed back, as the gateway's connection does.
"""
from __future__ import annotations

import json
import queue

import pytest

from talkgate.sessions.limits import Limits
from talkgate.sessions.native import AUDIO_HEADER, Close, NativeProtocol, Purge, Send
from talkgate.sessions.session import Session


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Harness:
    def __init__(self, engine, limits=Limits(max_contexts_per_connection=2, max_text_chars=100), authenticate=None):
        self.events: queue.Queue = queue.Queue()
        self.clock = Clock()
        self.proto = NativeProtocol(Session(engine, self.events.put, limits, clock=self.clock), limits, "s1",
                                    authenticate)

    def send(self, **msg):
        return self.proto.receive_text(json.dumps(msg))

    def pump(self, until_type: str, timeout: float = 60) -> list:
        """Feed engine events to the protocol until an action carries a JSON message of that type."""
        actions = []
        while True:
            new = self.proto.engine_event(self.events.get(timeout=timeout))
            actions += new
            if any(_type(a) == until_type for a in new):
                return actions


def _type(action):
    return json.loads(action.data)["type"] if isinstance(action, Send) and isinstance(action.data, str) else None


def _json(actions):
    return [json.loads(a.data) for a in actions if isinstance(a, Send) and isinstance(a.data, str)]


def test_ready_and_config(engine):
    h = Harness(engine)
    (ready,) = _json(h.proto.ready())
    assert ready["type"] == "session.ready" and ready["model"]["untrained"] is True
    (conf,) = _json(h.send(type="session.config", voice="RYAN", language="English",
                           format={"encoding": "opus", "sample_rate": 48000}))
    assert conf["config"]["voice"] == "ryan" and conf["config"]["language"] == "english"
    assert conf["config"]["format"] == {"encoding": "opus", "sample_rate": 48000}


def test_utterance_lifecycle_and_binary_header(engine):
    h = Harness(engine)
    (started,) = _json(h.send(type="text", context_id="a", text="Hello "))
    assert started == {"type": "context.started", "context_id": "a", "stream": 1,
                       "format": {"encoding": "pcm_s16le", "sample_rate": 24000}}
    assert h.send(type="text", context_id="a", text="world.") == []
    assert h.send(type="flush", context_id="a") == []
    actions = h.pump("context.done")
    audio = [a for a in actions if isinstance(a, Send) and isinstance(a.data, bytes)]
    assert audio, "no audio"
    seqs, starts = [], []
    for a in audio:
        version, enc, _, stream, seq, start_ms = AUDIO_HEADER.unpack_from(a.data)
        assert (version, enc, stream) == (1, 2, 1) and a.stream == 1
        assert a.audio_ms == pytest.approx((len(a.data) - AUDIO_HEADER.size) / 48)
        seqs.append(seq)
        starts.append(start_ms)
    assert seqs == list(range(len(audio))) and starts == sorted(starts)
    types = [t for t in map(_type, actions) if t]
    assert types.index("timing") < types.index("context.done")
    done = _json(actions)[-1]
    assert done["reason"] in ("eos", "budget") and done["frames"] * 80 == done["audio_ms"]


def test_cancel_purges_and_reports_sent_audio(engine):
    h = Harness(engine)
    h.send(type="context.start", context_id="c", fixed_frames=500)
    h.send(type="text", context_id="c", text="Some words to say.")
    h.send(type="flush", context_id="c")
    actions = h.pump("timing")
    sent = [a for a in actions if isinstance(a, Send) and a.stream == 1]
    for a in sent[:2]:                  # the socket wrote two of them
        h.proto.note_sent(a.stream, a.audio_ms)
    out = h.send(type="cancel", context_id="c")
    assert isinstance(out[0], Purge) and out[0].stream == 1
    (cancelled,) = _json(out)
    assert cancelled == {"type": "context.cancelled", "context_id": "c",
                         "audio_ms_sent": round(sum(a.audio_ms for a in sent[:2]), 1)}
    # events of the cancelled context still in flight are dropped
    while not h.events.empty():
        assert h.proto.engine_event(h.events.get()) == []
    assert _json(h.send(type="cancel", context_id="c"))[0]["code"] == "unknown_context"


def test_slow_consumer_is_cancelled_with_error(engine):
    h = Harness(engine, Limits(max_backlog_ms=400))
    h.send(type="context.start", context_id="s", fixed_frames=50)
    h.send(type="text", context_id="s", text="Nobody reads this.")
    h.send(type="flush", context_id="s")
    h.pump("timing")
    for _ in range(20):                   # 1.7 s of audio emitted, none of it taken by the client
        h.proto.engine_event(h.events.get(timeout=60))
    h.clock.t += 0.3                      # a real-time player would have taken 300 ms: not 400 behind
    assert h.proto.tick() == []
    h.clock.t += 0.2
    actions = h.proto.tick()
    err = _json(actions)[-1]
    assert err["code"] == "slow_consumer" and err["fatal"] is True and err["context_id"] == "s"
    assert Purge(1) in actions


def test_close_waits_for_contexts_then_closes(engine):
    h = Harness(engine)
    h.send(type="context.start", context_id="a", fixed_frames=3)
    h.send(type="text", context_id="a", text="Bye.")
    assert h.send(type="close") == []
    actions = h.pump("context.done")
    assert actions[-1] == Close(1000, "closed by client")


def test_auth_first_message(engine):
    h = Harness(engine, authenticate=lambda key: key == "k")
    assert h.proto.ready() == []
    out = h.send(type="text", context_id="a", text="x")
    assert _json(out)[0]["code"] == "unauthorized" and out[-1] == Close(1008, "unauthorized")
    h = Harness(engine, authenticate=lambda key: key == "k")
    assert _json(h.send(type="auth", api_key="k"))[0]["type"] == "session.ready"


def test_limits_and_empty_flush(engine):
    h = Harness(engine)
    h.send(type="context.start", context_id="a")
    h.send(type="context.start", context_id="b")
    assert _json(h.send(type="context.start", context_id="c"))[0]["code"] == "too_many_contexts"
    (done,) = _json(h.send(type="flush", context_id="a"))       # nothing was said: ends at once
    assert done["type"] == "context.done" and done["reason"] == "empty" and done["frames"] == 0
    err = _json(h.send(type="text", context_id="b", text="z" * 101))[0]
    assert err["code"] == "text_too_long" and err["fatal"] is True
    assert h.proto.session.active == []
    assert h.proto.idle_timeout()[-1] == Close(1000, "idle timeout")


def test_speed_stretches_the_delivered_audio(engine):
    h = Harness(engine)
    assert _json(h.send(type="context.start", context_id="f", speed=9))[0]["code"] == "invalid_params"
    h.send(type="context.start", context_id="f", fixed_frames=10, speed=2.0)
    h.send(type="text", context_id="f", text="Quickly now.")
    h.send(type="flush", context_id="f")
    actions = h.pump("context.done")
    samples = sum(len(a.data) - AUDIO_HEADER.size for a in actions if isinstance(a, Send)
                  and isinstance(a.data, bytes)) // 2
    assert samples == 10 * 1920 // 2           # half the duration, pitch kept (codecs/tempo.py)
    assert _json(actions)[-1]["frames"] == 10
