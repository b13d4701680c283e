"""The first-frame lane (synth/lane.py) on CPU: a new context that arrives while a step runs has its first frame
launched beside it, and the contexts' audio is what they make without it. The engines here are driven by run_once
on the test's thread; Engine.poll hands them the commands that "arrive" during a step (an engine process's
EngineServer reading a worker's socket: tests/system/test_engine_server_lane.py). On the CPU the lane's work
runs eagerly, in order: what is checked is the engine's side (which contexts take it, their commands, their
place in the steps after), not the overlap, which is a GPU's (docs/benchmarks.md)."""
from __future__ import annotations

import numpy as np
import pytest

from talkgate.synth.api import (
    AppendText, AudioChunk, CancelContext, ContextDone, ContextParams, EndText, OpenContext, SamplingParams,
)
from talkgate.synth.engine import Engine
from talkgate.synth.request import text_seconds

GREEDY = SamplingParams(greedy=True)
LONG = "Hello there, this is a streaming test. It has two sentences!"
SHORT = "A second voice starts here."


@pytest.fixture(scope="module")
def lane_engine(tiny_checkpoint):
    return Engine.from_pretrained(str(tiny_checkpoint), device="cpu", max_contexts=4, max_frames_per_context=80,
                                  lane=True)


class Calls:
    """A client driven on the test's thread: each deliver call's events."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self.id = engine.connect(self.calls.append)

    def commands(self, context, text, params):
        tok = self.engine.new_tokenizer()
        return [OpenContext(context, params), AppendText(context, tuple(tok.feed(text)), text_seconds(text)),
                EndText(context, tuple(tok.finish()))]

    def events(self, context):
        return [ev for call in self.calls for ev in call if ev.context == context]

    def pcm(self, context):
        return np.concatenate([ev.pcm for ev in self.events(context) if isinstance(ev, AudioChunk)])

    def done(self, context):
        return any(isinstance(ev, ContextDone) for ev in self.events(context))


def run(engine, c: Calls, contexts, steps=400):
    for _ in range(steps):
        engine.run_once()
        if all(c.done(ctx) for ctx in contexts):
            return
    raise AssertionError(f"contexts {contexts} did not finish")


def far_ahead(engine, c: Calls, context: int) -> None:
    """The context's client as if it had a minute of audio to play: first_frames_apart lets new contexts go apart
    from it however slow the steps of a busy test machine are."""
    engine._clients[c.id].contexts[context].t_ready += 60.0


def running_far_ahead(engine, c: Calls, context: int = 1) -> None:
    """`context` speaking LONG, four frames out, its client far ahead (far_ahead)."""
    engine.submit(c.id, c.commands(context, LONG, ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=30)))
    while sum(isinstance(ev, AudioChunk) for ev in c.events(context)) < 4:
        engine.run_once()
    far_ahead(engine, c, context)


def step_while_arriving(engine, client: int, commands: list) -> None:
    """One run_once during whose step `commands` of `client` arrive (Engine.poll)."""
    steps = engine._steps
    engine.poll = lambda: engine.submit(client, commands) if engine._steps == steps else None
    try:
        engine.run_once()
    finally:
        engine.poll = None


def arriving_during_a_step(engine, messages: list[list], speaking: list[int], frames_first=4):
    """Context 1 runs; after its `frames_first` frames, each of `messages` arrives while a step runs (Engine.poll),
    one a step, and the engine runs until context 1 and those `speaking` are done. The client."""
    c = Calls(engine)
    p1 = ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=30)
    engine.submit(c.id, c.commands(1, LONG, p1))
    while sum(isinstance(ev, AudioChunk) for ev in c.events(1)) < frames_first:
        engine.run_once()
    far_ahead(engine, c, 1)
    left, polled = list(messages), set()

    def poll():
        if left and engine._steps not in polled:
            polled.add(engine._steps)
            engine.submit(c.id, left.pop(0))
    engine.poll = poll
    try:
        run(engine, c, [1, *speaking])
    finally:
        engine.poll = None
    assert not left
    return c


def alone(engine, context, text, params):
    c = Calls(engine)
    engine.submit(c.id, c.commands(context, text, params))
    run(engine, c, [context])
    engine.disconnect(c.id)
    return c.pcm(context)


def test_a_context_arriving_during_a_step_takes_the_lane_and_speaks_as_it_would_alone(lane_engine):
    """Its open and first frame are launched while the running context's step is in flight (a lane launch), it
    runs with the running context from the next step on, and both contexts' audio is what each makes alone."""
    eng = lane_engine
    p1 = ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=30)
    p2 = ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=8)
    ref1, ref2 = alone(eng, 1, LONG, p1), alone(eng, 2, SHORT, p2)       # the prompt's prefix is kept from here on
    before = eng.stats()["lane_launches"]
    c = arriving_during_a_step(eng, [Calls(eng).commands(2, SHORT, p2)], [2])
    assert eng.stats()["lane_launches"] == before + 1
    np.testing.assert_allclose(c.pcm(1), ref1, atol=1e-5)
    np.testing.assert_allclose(c.pcm(2), ref2, atol=1e-5)
    frames = [ev.first_frame for ev in c.events(2) if isinstance(ev, AudioChunk)]
    assert frames == list(range(8)) and isinstance(c.events(2)[-1], ContextDone)
    # the step after the lane's carries context 2's frame 1 beside context 1's frame: one call holds both
    assert any({1, 2} <= {ev.context for ev in call if isinstance(ev, AudioChunk)} for call in c.calls)
    eng.disconnect(c.id)


def test_what_cannot_take_the_lane_waits_for_the_step_boundary(lane_engine):
    """A context of a prompt whose prefix is not kept and one cancelled in the same message: neither takes the lane;
    the first is served from the step boundary, the second never is."""
    eng = lane_engine
    p = ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=6)
    other = ContextParams(voice="vivian", sampling=GREEDY, fixed_frames=6)
    calls = Calls(eng)
    new_prompt = calls.commands(4, SHORT, other)
    cancelled = [*calls.commands(5, SHORT, p), CancelContext(5)]
    eng.disconnect(calls.id)
    before = eng.stats()["lane_launches"]
    c = arriving_during_a_step(eng, [new_prompt + cancelled], [4])
    assert eng.stats()["lane_launches"] == before
    assert [ev.first_frame for ev in c.events(4) if isinstance(ev, AudioChunk)] == list(range(6))
    assert c.events(5) == []
    eng.disconnect(c.id)


def test_a_context_opened_before_its_text_takes_the_lane_when_its_first_text_comes(lane_engine):
    """Streamed text: the context's open comes during one step (opened at the boundary after it, no text yet), its
    first text during the next: that text launches its first frame on the lane (no open there: its slot is set),
    and its audio is what it makes alone."""
    eng = lane_engine
    p = ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=6)
    ref = alone(eng, 3, SHORT, p)
    opening = Calls(eng).commands(3, SHORT, p)
    before = eng.stats()["lane_launches"]
    c = arriving_during_a_step(eng, [opening[:1], opening[1:]], [3])
    assert eng.stats()["lane_launches"] == before + 1
    np.testing.assert_allclose(c.pcm(3), ref, atol=1e-5)
    assert [ev.first_frame for ev in c.events(3) if isinstance(ev, AudioChunk)] == list(range(6))
    eng.disconnect(c.id)


def test_a_lane_context_cancelled_before_its_audio_goes_out_makes_no_event(lane_engine):
    """Cancelled once its first frame was made on the lane, before the next step hands that frame out: no audio, no
    done; its slot is free, and serves the next context."""
    eng = lane_engine
    p = ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=6)
    c = Calls(eng)
    running_far_ahead(eng, c)
    before = eng.stats()["lane_launches"]
    step_while_arriving(eng, c.id, c.commands(6, SHORT, p))
    assert eng.stats()["lane_launches"] == before + 1
    eng.submit(c.id, [CancelContext(6)])
    run(eng, c, [1])
    assert c.events(6) == []
    assert eng.free_slots == eng.runner.num_slots
    assert len(alone(eng, 7, SHORT, p)) == 6 * 1920
    eng.disconnect(c.id)


def test_engines_sharing_a_gpu_take_the_lane_but_launch_no_pass_apart(lane_engine):
    """first_apart False (an engine process whose GPU other engine processes share: a pass of its own would wait for
    their kernels): a context queued at a step boundary joins the running rows' launch instead of a pass ahead of
    it, and a context arriving during a step still takes the lane, of the highest priority."""
    eng = lane_engine
    p = ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=6)
    alone(eng, 2, SHORT, p)                                               # the prompt's prefix kept
    for first_apart, launches in ((True, 2), (False, 1)):
        eng.first_apart = first_apart
        try:
            c = Calls(eng)
            running_far_ahead(eng, c)
            eng.submit(c.id, c.commands(3, SHORT, p))                    # queued at the boundary
            before = eng.runner.launches
            eng.run_once()
            assert eng.runner.launches - before == launches
            far_ahead(eng, c, 3)
            lanes = eng.stats()["lane_launches"]
            step_while_arriving(eng, c.id, c.commands(4, SHORT, p))
            assert eng.stats()["lane_launches"] == lanes + 1
            run(eng, c, [1, 3, 4])
            assert [len(c.pcm(ctx)) for ctx in (3, 4)] == [6 * 1920] * 2
            eng.disconnect(c.id)
        finally:
            eng.first_apart = True


def test_two_contexts_arriving_during_one_step_both_take_the_lane_one_behind_the_other(lane_engine):
    """LANE_SETS lane launches in flight at once: the second new context is launched on the lane behind the first,
    not at the step boundary; a third waits for the boundary. Each speaks as it does alone."""
    from talkgate.synth.lane import LANE_SETS
    assert LANE_SETS == 2
    eng = lane_engine
    params = [ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=n) for n in (5, 7, 6)]
    refs = [alone(eng, 10 + i, SHORT, p) for i, p in enumerate(params)]
    c = Calls(eng)
    running_far_ahead(eng, c)
    before, launches = eng.stats()["lane_launches"], eng.runner.launches
    step_while_arriving(eng, c.id, [cmd for i, p in enumerate(params) for cmd in c.commands(10 + i, SHORT, p)])
    assert eng.stats()["lane_launches"] == before + 2
    assert eng.runner.launches == launches + 1                   # the running context's step only
    run(eng, c, [1, 10, 11, 12])
    assert eng.stats()["lane_launches"] == before + 2            # the third at the step boundary
    for i, ref in enumerate(refs):
        np.testing.assert_allclose(c.pcm(10 + i), ref, atol=1e-5)
    eng.disconnect(c.id)
