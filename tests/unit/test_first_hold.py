"""A first token committed alone by its delta ("好的"): frame 0's audio is held until the second token, the end or a
flush of the text, the engine's next word on the context, or FIRST_HOLD_S (sessions/session.py), Sans-I/O: a Session
with the real tokenizer and an injected clock, engine events built here, no engine and no socket."""
from __future__ import annotations

import pytest

from talkgate.sessions.deepgram import DeepgramProtocol
from talkgate.sessions.limits import Limits
from talkgate.sessions.native import NativeProtocol
from talkgate.sessions.session import (FIRST_HOLD_MAX_S, FIRST_HOLD_S, FIRST_HOLD_STEPS, AudioOut, ContextError,
                                       FlushSpoken, Session, first_hold_s)
from talkgate.sessions.voices import VoiceMap
from talkgate.synth.api import AudioChunk, ContextDone, ContextFailed, TextSpoken
from talkgate.synth.tokenizer import StreamingTokenizer
from tests.compat_harness import INFO, Clock, Harness, pcm


def make(tokenizer):
    clock = Clock()
    session = Session(INFO, Limits(), lambda: StreamingTokenizer(tokenizer), clock=clock)
    return session, clock


def frame(session: Session, n: int = 0, step_s: float = 0.0) -> list:
    """Frame n of the session's only context arrives from the engine, whose step takes `step_s`."""
    (context,) = session._by_context
    return session.on_engine_event(AudioChunk(context, pcm(n), n, 1, 0.0, step_s))


def kinds(events: list) -> list[str]:
    return [type(e).__name__ for e in events]


def held(tokenizer) -> tuple[Session, Clock]:
    """A session whose context's first delta "好的" committed one id, nothing pending, and whose frame 0 came: held."""
    session, clock = make(tokenizer)
    session.append("a", "好的")
    assert [len(c.ids) for c in session.take_commands()[1:]] == [1]
    assert session._by_id["a"].tokenizer.pending == ""
    assert frame(session) == []
    assert session.due_in() == pytest.approx(FIRST_HOLD_S)
    assert list(session._holding) == [1]
    return session, clock


def test_a_lone_first_token_holds_frame_0_until_the_second_token(tokenizer):
    session, clock = held(tokenizer)
    clock.t += 0.01
    assert session.append("a", "这") == []                 # nothing committed: still held
    assert session.due_in() == pytest.approx(FIRST_HOLD_S - 0.01)
    clock.t += 0.01
    out = session.append("a", "次会")                        # "这次" commits: the second token
    assert kinds(out) == ["AudioOut", "FirstAudio"]
    assert out[-1].ttfa_ms == pytest.approx(20.0)           # timed when the client gets it, not when it came
    assert session.due_in() is None and session._holding == {}
    assert kinds(frame(session, 1)) == ["AudioOut"]     # frame 1 follows as usual
    assert session.tick() == []


def test_end_text_and_flush_text_release_the_held_frame(tokenizer):
    session, _ = held(tokenizer)
    assert kinds(session.end_text("a")) == ["AudioOut", "FirstAudio"]
    assert session.due_in() is None
    session, _ = held(tokenizer)
    assert kinds(session.flush_text("a")) == ["AudioOut", "FirstAudio"]
    assert session.due_in() is None and session.active == ["a"]


def test_tick_releases_after_first_hold_s_not_before(tokenizer):
    session, clock = held(tokenizer)
    clock.t += FIRST_HOLD_S - 0.001
    assert session.tick() == []
    assert session.due_in() == pytest.approx(0.001)
    clock.t += 0.001
    out = session.tick()
    assert kinds(out) == ["AudioOut", "FirstAudio"] and out[-1].ttfa_ms == pytest.approx(40.0)
    assert session.due_in() is None and session.tick() == []


def test_the_hold_grows_with_the_engines_step_between_its_floor_and_its_cap():
    assert first_hold_s(0.0) == first_hold_s(FIRST_HOLD_S / FIRST_HOLD_STEPS) == FIRST_HOLD_S     # idle, 8-ms steps
    assert first_hold_s(0.016) == pytest.approx(FIRST_HOLD_STEPS * 0.016)                      # 512 streams
    assert first_hold_s(0.05) == first_hold_s(5.0) == FIRST_HOLD_MAX_S                           # never longer


def test_under_load_the_held_frame_waits_for_the_second_token_past_first_hold_s(tokenizer):
    """With 16-ms steps frame 0 is held 80 ms: the second token, committed by the third delta 80 ms after the first
    (less the ~20 ms frame 0 took), lets it out, not the 40-ms floor."""
    session, clock = make(tokenizer)
    session.append("a", "好的")
    session.take_commands()
    assert frame(session, step_s=0.016) == []
    assert session.due_in() == pytest.approx(0.08)
    clock.t += FIRST_HOLD_S
    assert session.tick() == [] and session.due_in() == pytest.approx(0.04)     # 40 ms on: still held
    clock.t += 0.02
    assert session.append("a", "这") == []
    out = session.append("a", "次会")                        # "这次": the second token
    assert kinds(out) == ["AudioOut", "FirstAudio"] and out[-1].ttfa_ms == pytest.approx(60.0)
    assert session.due_in() is None and session.tick() == []
    session, clock = make(tokenizer)                          # no second token: out at the step-scaled bound
    session.append("a", "好的")
    frame(session, step_s=0.5)
    clock.t += FIRST_HOLD_MAX_S
    assert kinds(session.tick()) == ["AudioOut", "FirstAudio"]


def test_a_delta_that_commits_nothing_before_frame_0_comes_does_not_lift_the_hold(tokenizer):
    """Frame 0 slower than a delta (a loaded engine): the next delta "这" is pending when it comes, and the second token
    is still the third delta's. It is held all the same (the lone first token is judged at its commit)."""
    session, clock = make(tokenizer)
    session.append("a", "好的")
    session.take_commands()
    clock.t += 0.04
    assert session.append("a", "这") == [] and session._by_id["a"].tokenizer.pending == "这"
    assert frame(session, step_s=0.016) == [] and session.due_in() == pytest.approx(0.08)
    clock.t += 0.04
    assert kinds(session.append("a", "次会")) == ["AudioOut", "FirstAudio"]     # the second token lets it out


def test_the_engines_next_event_releases_the_held_frame_first(tokenizer):
    session, _ = held(tokenizer)
    out = frame(session, 1)                                 # frame 1 came anyway: both, in order
    assert kinds(out) == ["AudioOut", "FirstAudio", "AudioOut"]
    assert [e.seq for e in out if isinstance(e, AudioOut)] == [0, 1]
    session, _ = held(tokenizer)
    out = session.on_engine_event(ContextDone(next(iter(session._by_context)), "eos", 1))
    assert kinds(out) == ["AudioOut", "FirstAudio", "ContextFinished"]
    assert out[-1].ttfa_ms is not None and session._holding == {}
    session, _ = held(tokenizer)
    session.flush_text("a")
    out = session.on_engine_event(TextSpoken(next(iter(session._by_context)), "length_rule", 1))
    assert isinstance(out[-1], FlushSpoken)
    session, _ = held(tokenizer)
    out = session.on_engine_event(ContextFailed(next(iter(session._by_context)), "engine_failed", "gone"))
    assert isinstance(out[-1], ContextError) and out[-1].stream == 1     # its wire layer purges the stream
    assert session._holding == {} and session.active == []


def test_a_boundary_sends_the_held_frame_before_its_pause(tokenizer):
    session, _ = held(tokenizer)
    out = session.at_boundary("a", pause_ms=80)
    assert kinds(out[:2]) == ["AudioOut", "FirstAudio"]
    assert [e.seq for e in out if isinstance(e, AudioOut)] == list(range(len(out) - 1))


def test_cancel_and_close_drop_the_held_frame_and_leave_nothing_held(tokenizer):
    session, clock = held(tokenizer)
    assert kinds(session.cancel("a")) == ["ContextCancelled"]
    assert session._holding == {} and session.due_in() is None
    clock.t += 1
    assert session.tick() == []
    session, _ = held(tokenizer)
    session.close()
    assert session._holding == {} and session.due_in() is None


def test_a_first_token_committed_with_more_text_is_never_held(tokenizer):
    # English: the first word is committed by the second delta, which leaves the next word pending
    session, _ = make(tokenizer)
    session.append("a", "Hello")
    session.append("a", " world")
    assert session._by_id["a"].text_tokens == 1 and session._by_id["a"].tokenizer.pending
    assert kinds(frame(session)) == ["AudioOut", "FirstAudio"]
    # two ids committed by the first delta
    session, _ = make(tokenizer)
    session.append("a", "12")
    assert session._by_id["a"].text_tokens == 2 and not session._by_id["a"].tokenizer.pending
    assert kinds(frame(session)) == ["AudioOut", "FirstAudio"]
    # the text ended before the frame came (an HTTP request's whole text too)
    session, _ = make(tokenizer)
    session.append("a", "好的")
    session.end_text("a")
    assert kinds(frame(session)) == ["AudioOut", "FirstAudio"]
    assert session.due_in() is None and session._holding == {}


def test_protocols_tick_turns_the_released_frame_into_wire_actions(tokenizer):
    h = Harness(tokenizer, lambda s: NativeProtocol(s, Limits(), "s1"))
    assert h.proto.due_in() is None
    h.send({"type": "text", "context_id": "a", "text": "好的"})
    (ctx,) = h.opened()
    h.deliver()
    assert h.audio(ctx) == [] and h.proto.due_in() == pytest.approx(FIRST_HOLD_S)
    h.clock.t += FIRST_HOLD_S
    assert h.deliver() == []
    h.apply(h.proto.tick())
    out = h.deliver()
    assert [type(m).__name__ for m in out] == ["bytes", "dict"] and out[1]["type"] == "timing"
    assert h.proto.due_in() is None
    # an utterance protocol (the compatible APIs' Utterances): its tick too
    voices = VoiceMap({"deepgram": {"aura-test": INFO.voices[0]}})
    h = Harness(tokenizer, lambda s: DeepgramProtocol(s, "s1", {"model": "aura-test"}, voices))
    h.ready()
    h.send({"type": "Speak", "text": "好的"})
    (ctx,) = h.opened()
    h.deliver()
    assert h.audio(ctx) == [] and h.proto.due_in() == pytest.approx(FIRST_HOLD_S)
    h.clock.t += FIRST_HOLD_S
    h.apply(h.proto.tick())
    assert [type(m).__name__ for m in h.deliver()] == ["bytes"]
    assert h.proto.due_in() is None
