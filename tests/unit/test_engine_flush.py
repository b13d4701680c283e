"""FlushText on CPU with the tiny random checkpoint: a flush speaks the text so far and keeps the engine
context open; text sent after it continues the same context, its audio after the flushed text's."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from talkgate.synth.api import AudioChunk, ContextDone, ContextParams, SamplingParams, TextSpoken
from talkgate.synth.engine import Engine
from talkgate.synth.request import frames_for_seconds, text_seconds
from tests.speaker import Collector, Speaker

FIRST, SECOND = "Hello there. ", "How are you today?"


@pytest.fixture(scope="module")
def speaker(tiny_checkpoint):
    eng = Engine.from_pretrained(str(tiny_checkpoint), device="cpu", max_contexts=2, max_frames_per_context=120)
    eng.start()
    yield Speaker(eng)
    eng.stop()


def wait_for(sink: Collector, kind, n: int = 1, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while sum(isinstance(e, kind) for e in sink.events) < n:
        assert time.time() < deadline, f"no {kind.__name__} after {timeout} s: {sink.events[-3:]}"
        time.sleep(0.005)


def frames(events) -> list[int]:
    return [e.first_frame for e in events if isinstance(e, AudioChunk)]


def test_flush_speaks_then_waits_then_the_same_context_goes_on(speaker):
    """The untrained checkpoint speaks a flush to the text-length rule of the text so far (its stand-in for
    the model's end of speech), waits without a frame, then speaks the next text in the same context."""
    sink = Collector()
    ctx = speaker.open(ContextParams(sampling=SamplingParams(seed=5)), sink)
    speaker.append(ctx, FIRST)
    speaker.flush(ctx)
    wait_for(sink, TextSpoken)
    n1 = frames_for_seconds(text_seconds(FIRST))
    assert sink.events[-1] == TextSpoken(ctx, "length_rule", n1)
    assert frames(sink.events) == list(range(n1))             # the flushed text's audio, all before TextSpoken
    time.sleep(0.3)
    assert len(sink.events) == n1 + 1                         # open, and waiting for text: no frame
    speaker.append(ctx, SECOND)
    speaker.end(ctx)
    sink.wait()
    total = frames_for_seconds(text_seconds(FIRST) + text_seconds(SECOND))
    assert sink.last == ContextDone(ctx, "length_rule", total)
    assert frames(sink.events) == list(range(total))          # one context, its frames continued


def test_text_sent_during_a_flush_waits_for_its_audio(speaker):
    """Text and a second flush sent right after the first flush: the first flush's audio and its TextSpoken
    come first, then the second part's, then its TextSpoken; the context stays open after both."""
    sink = Collector()
    ctx = speaker.open(ContextParams(sampling=SamplingParams(seed=6)), sink)
    speaker.append(ctx, FIRST)
    speaker.flush(ctx)
    speaker.append(ctx, SECOND)
    speaker.flush(ctx)
    speaker.flush(ctx)                                         # nothing new: answered in order, no frame
    wait_for(sink, TextSpoken, 3)
    n1 = frames_for_seconds(text_seconds(FIRST))
    n2 = frames_for_seconds(text_seconds(FIRST) + text_seconds(SECOND))
    spoken = [i for i, e in enumerate(sink.events) if isinstance(e, TextSpoken)]
    assert [sink.events[i] for i in spoken] == [TextSpoken(ctx, "length_rule", n1), TextSpoken(ctx, "length_rule", n2),
                                                TextSpoken(ctx, "empty", n2)]
    assert frames(sink.events[:spoken[0]]) == list(range(n1))
    assert frames(sink.events[spoken[0]:spoken[1]]) == list(range(n1, n2))
    assert spoken[2] == spoken[1] + 1 and not sink.done.is_set()
    speaker.end(ctx)                                           # nothing new since the last flush: ends at once
    assert sink.wait().last == ContextDone(ctx, "length_rule", n2) and len(sink.events) == spoken[2] + 2


def test_an_eos_row_leaves_its_slot_as_it_was(speaker):
    """The runner: a row whose codebook 0 is eos makes no frame, and the codec decoder state of its slot is
    left as it was (the dummy slot takes the row), so a flushed context that the model ended goes on from
    its last frame; a frame that is not eos advances it."""
    runner = speaker.engine.runner
    slot = 0
    state = runner.dec_state
    with torch.inference_mode():
        runner.main.inputs[0, :1] = slot
        before = [t.clone() for t in (state.tails[slot], state.kv[:, slot], state.pos[slot])]
        runner.main.codes[:1] = 7
        runner.main.codes[0, 0] = runner.codec_eos
        runner._decode_step(1, runner.main)
        after = [state.tails[slot], state.kv[:, slot], state.pos[slot]]
        assert all(torch.equal(a, b) for a, b in zip(before, after))
        runner.main.codes[0, 0] = 7
        runner._decode_step(1, runner.main)
        assert not torch.equal(before[2], state.pos[slot])
    runner.dec_state.reset_slots(torch.tensor([slot]))
    assert np.isfinite(runner.main.pcm[:1].numpy()).all()
