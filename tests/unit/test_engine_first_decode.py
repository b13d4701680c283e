"""A step's new contexts' first frames decoded ahead of its running rows (Runner.launch decode_first, chosen by the
Engine past first_frames_apart's rows): every context's audio is what it is without it, and the new contexts' first
chunks are handed out by the step that made them, before the running rows' chunks of that step. On the CPU the
decodes run eagerly, in order; the rows' thresholds are lowered so that one running context is "past" them. Audio
made in batches of other sizes rounds differently: equal within 1e-5, as tests/unit/test_engine_lane.py's."""
from __future__ import annotations

import numpy as np
import pytest

import talkgate.synth.engine as engine_module
from talkgate.synth.api import AudioChunk, ContextParams
from talkgate.synth.engine import Engine
from tests.unit.test_engine_lane import GREEDY, SHORT, Calls, run, running_far_ahead


def speak(tiny_checkpoint, monkeypatch, decode_first: bool, new: list[int]):
    """Context 1 running (far ahead of its client), then the contexts `new` arriving together: the engine and its
    client's deliver calls."""
    monkeypatch.setattr(engine_module, "FIRST_APART_MAX_ROWS", 0)           # one running row is past it
    monkeypatch.setattr(engine_module, "FIRST_DECODE_MAX_ROWS", 8 if decode_first else 0)
    engine = Engine.from_pretrained(str(tiny_checkpoint), device="cpu", max_contexts=4, max_frames_per_context=80)
    c = Calls(engine)
    running_far_ahead(engine, c, 1)
    engine.submit(c.id, [cmd for context in new for cmd in c.commands(
        context, SHORT, ContextParams(voice="ryan", sampling=GREEDY, fixed_frames=8 + context))])
    run(engine, c, [1, *new])
    return engine, c


@pytest.mark.parametrize("new", [[2], [2, 3]])
def test_first_frames_decoded_ahead_give_every_context_the_same_audio(tiny_checkpoint, monkeypatch, new):
    plain, c0 = speak(tiny_checkpoint, monkeypatch, False, new)
    ahead, c1 = speak(tiny_checkpoint, monkeypatch, True, new)
    assert plain.runner.first_decodes == 0 and ahead.runner.first_decodes == 1
    for context in (1, *new):
        assert len(c1.pcm(context)) == (30 if context == 1 else 8 + context) * 1920
        np.testing.assert_allclose(c1.pcm(context), c0.pcm(context), atol=1e-5)     # (a batch's rounding)
    # the step that made the new contexts' first frames handed them out in a deliver call of their own, ahead of
    # context 1's frame of that step
    calls = [[ev for ev in call if isinstance(ev, AudioChunk)] for call in c1.calls]
    at = next(i for i, call in enumerate(calls) if any(ev.first_frame == 0 and ev.context in new for ev in call))
    assert sorted(ev.context for ev in calls[at]) == new and all(ev.first_frame == 0 for ev in calls[at])
    assert any(ev.context == 1 for ev in calls[at + 1])
