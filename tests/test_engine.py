"""The streaming engine on CPU with the tiny random checkpoint (fp32, greedy where outputs are compared)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from talkgate.synth.api import (
    AudioChunk, ContextDone, ContextFailed, ContextParams, EngineFull, InvalidParams, SamplingParams,
    UnknownLanguage, UnknownVoice,
)
from talkgate.synth.engine import Engine

GREEDY = SamplingParams(greedy=True)
TEXT = "Hello there, this is a streaming test. It has two sentences!"


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


@pytest.fixture(scope="module")
def engine(checkpoint):
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=4, max_frames_per_context=120)
    eng.start()
    yield eng
    eng.stop()


class Collector:
    """A sink: records events; `done` is set by the last event of the context."""

    def __init__(self):
        self.events, self.done = [], threading.Event()
        self.lock = threading.Lock()

    def __call__(self, ev):
        with self.lock:
            self.events.append(ev)
        if not isinstance(ev, AudioChunk):
            self.done.set()

    def wait(self, timeout=60.0):
        assert self.done.wait(timeout), "context did not finish"
        return self

    @property
    def chunks(self):
        return [e for e in self.events if isinstance(e, AudioChunk)]

    @property
    def pcm(self):
        return np.concatenate([c.pcm for c in self.chunks])

    @property
    def last(self):
        return self.events[-1]


def speak(engine, deltas, params=None, end=True):
    sink = Collector()
    ctx = engine.open(params or ContextParams(sampling=GREEDY, fixed_frames=12), sink)
    for d in deltas:
        engine.append_text(ctx, d)
    if end:
        engine.end_text(ctx)
    return ctx, sink


def test_fixed_frames_honoured(engine):
    _, sink = speak(engine, [TEXT], ContextParams(sampling=SamplingParams(seed=1), fixed_frames=9))
    sink.wait()
    assert [c.first_frame for c in sink.chunks] == list(range(9))
    assert all(c.pcm.shape == (1920,) and c.pcm.dtype == np.float32 for c in sink.chunks)
    assert sink.last == ContextDone(sink.last.context, "length", 9)


def test_streamed_deltas_equal_whole_text(engine):
    _, whole = speak(engine, [TEXT])
    pieces = [TEXT[i:i + 3] for i in range(0, len(TEXT), 3)]
    _, streamed = speak(engine, pieces)
    whole.wait(), streamed.wait()
    assert len(whole.chunks) == 12
    np.testing.assert_allclose(whole.pcm, streamed.pcm, atol=1e-5)   # run side by side: batch 2 vs 1


def test_batching_invariance(engine):
    """Contexts side by side give what each gives alone (greedy, and seeded sampling: the noise is a
    function of seed and frame, never of the batch). The tiny random model hardly hears its text, so
    the seeds are what tells these contexts apart."""
    runs = [("One two three.", GREEDY), ("A different sentence here", SamplingParams(seed=1)),
            (TEXT, SamplingParams(seed=2))]
    alone = []
    for text, sampling in runs:
        _, s = speak(engine, [text], ContextParams(sampling=sampling, fixed_frames=12))
        alone.append(s.wait().pcm)
    together = [speak(engine, [text], ContextParams(sampling=sampling, fixed_frames=12), end=False)
                for text, sampling in runs]
    for ctx, _ in together:
        engine.end_text(ctx)
    for (_, s), ref in zip(together, alone):
        np.testing.assert_allclose(s.wait().pcm, ref, atol=1e-5)
    assert not np.allclose(alone[1], alone[2], atol=1e-3)


def test_seeded_sampling_is_reproducible_and_batch_independent(engine):
    p = ContextParams(sampling=SamplingParams(seed=7), fixed_frames=10)
    _, a = speak(engine, [TEXT], p)
    a.wait()
    _, b = speak(engine, [TEXT], p)
    _, other = speak(engine, ["Something else entirely."], ContextParams(sampling=SamplingParams(seed=8), fixed_frames=10))
    np.testing.assert_allclose(b.wait().pcm, a.pcm, atol=1e-5)
    other.wait()


def test_default_seed_makes_unseeded_contexts_reproducible(checkpoint, engine):
    unseeded = ContextParams(fixed_frames=8)
    seeded = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=2, max_frames_per_context=120,
                                    default_seed=11)
    seeded.start()
    try:
        _, a = speak(seeded, [TEXT], unseeded)
        _, b = speak(seeded, [TEXT], unseeded)
        np.testing.assert_allclose(b.wait().pcm, a.wait().pcm, atol=1e-5)
        _, own = speak(seeded, [TEXT], ContextParams(sampling=SamplingParams(seed=12), fixed_frames=8))
        assert not np.allclose(own.wait().pcm, a.pcm, atol=1e-3)        # a context's own seed wins
    finally:
        seeded.stop()
    _, fresh = speak(engine, [TEXT], unseeded)                            # no default: a fresh seed each
    _, fresh2 = speak(engine, [TEXT], unseeded)
    assert not np.allclose(fresh.wait().pcm, fresh2.wait().pcm, atol=1e-3)


def test_seed_range_and_a_failed_slot_fails_only_its_context(engine):
    with pytest.raises(InvalidParams, match="64 bits"):
        engine.open(ContextParams(sampling=SamplingParams(seed=1 << 64)), Collector())
    with pytest.raises(InvalidParams, match="64 bits"):
        engine.open(ContextParams(sampling=SamplingParams(seed=-(1 << 63) - 1)), Collector())
    # an unsigned 64-bit seed is the signed one of the same bits
    p = [ContextParams(sampling=SamplingParams(seed=s), fixed_frames=4) for s in ((1 << 64) - 1, -1)]
    _, big = speak(engine, [TEXT], p[0])
    _, minus_one = speak(engine, [TEXT], p[1])
    np.testing.assert_allclose(big.wait().pcm, minus_one.wait().pcm, atol=1e-5)
    # a value the slot's tensors cannot hold (the Python API checks no ranges): that context fails, the
    # engine thread goes on
    _, bad = speak(engine, [TEXT], ContextParams(sampling=SamplingParams(top_k=1 << 70), fixed_frames=4))
    assert isinstance(bad.wait().last, ContextFailed)
    _, after = speak(engine, [TEXT])
    assert len(after.wait().chunks) == 12


def test_waiting_context_does_not_block_others(engine):
    ctx_wait, waiting = speak(engine, [], end=False)      # no text yet: nothing to compute
    _, other = speak(engine, [TEXT])
    other.wait()
    assert len(other.chunks) == 12 and waiting.events == []
    engine.append_text(ctx_wait, "Now it comes.")
    engine.end_text(ctx_wait)
    assert len(waiting.wait().chunks) == 12


def test_held_engine_steps_nothing_until_released(engine):
    """Engine.hold (the gateway's event pump is behind) stops steps, not contexts: nothing is lost."""
    held = threading.Event()
    held.set()
    engine.hold = held.is_set
    try:
        _, sink = speak(engine, [TEXT])
        time.sleep(0.3)
        assert sink.events == []
        held.clear()
        assert sink.wait().last.reason == "length" and len(sink.chunks) == 12
    finally:
        engine.hold = None


def test_context_waits_for_its_next_token(engine):
    """With text still open, a context cannot run ahead of its committed tokens (one token a frame)."""
    ctx, sink = speak(engine, ["Hello there "], ContextParams(sampling=GREEDY, fixed_frames=40), end=False)
    time.sleep(0.5)
    n = len(sink.chunks)
    assert 1 <= n <= 3                                      # "Hello", " there": at most a token per frame
    engine.end_text(ctx)
    assert sink.wait().last.reason == "length" and len(sink.chunks) == 40


def test_cancel_mid_utterance_then_slot_reused(engine):
    params = ContextParams(sampling=GREEDY, fixed_frames=120)
    late = []
    cancelled = threading.Event()

    class Sink(Collector):
        def __call__(self, ev):
            if cancelled.is_set():
                late.append(ev)
            super().__call__(ev)

    sink = Sink()
    ctx = engine.open(params, sink)
    engine.append_text(ctx, TEXT * 3)
    engine.end_text(ctx)
    deadline = time.time() + 30
    while len(sink.chunks) < 3 and time.time() < deadline:
        time.sleep(0.005)
    engine.cancel(ctx)
    cancelled.set()
    engine.cancel(ctx)                                      # idempotent
    time.sleep(0.3)
    assert late == [] and 3 <= len(sink.chunks) < 120
    assert not any(isinstance(e, ContextDone) for e in sink.events)
    # all slots usable again
    runs = [speak(engine, [TEXT]) for _ in range(4)]
    for _, s in runs:
        assert s.wait().last.reason == "length"


def test_engine_full_when_out_of_slots(engine):
    opened = [speak(engine, [], end=False) for _ in range(4)]
    with pytest.raises(EngineFull):
        engine.open(ContextParams(), Collector())
    for ctx, _ in opened:
        engine.cancel(ctx)
    ctx, sink = speak(engine, [TEXT])
    assert sink.wait().last.reason == "length"


def test_invalid_params_raised_by_open(engine):
    with pytest.raises(UnknownVoice):
        engine.open(ContextParams(voice="nobody"), Collector())
    with pytest.raises(UnknownLanguage):
        engine.open(ContextParams(language="klingon"), Collector())
    assert engine.stats()["free_slots"] == 4


def test_empty_text_ends_at_once(engine):
    _, sink = speak(engine, [])
    assert sink.wait().last == ContextDone(sink.last.context, "eos", 0)


def test_untrained_ends_by_the_text_rule_and_stats(engine):
    """An untrained checkpoint (random weights never sample eos usefully): a context without fixed_frames
    ends where the text-length rule puts it for the text it received, streamed deltas included."""
    from talkgate.synth.engine import frames_for_text
    assert engine.info.untrained and engine.info.end_of_speech == "text_length_rule"
    deltas = ["Hello there, ", "this is streamed ", "in three parts."]
    _, sink = speak(engine, deltas, ContextParams(sampling=SamplingParams(seed=3)))
    want = frames_for_text("".join(deltas))
    assert want == 34 and sink.wait().last == ContextDone(sink.last.context, "length_rule", want)
    assert [c.first_frame for c in sink.chunks] == list(range(want))
    _, sink = speak(engine, ["Hi."], ContextParams(sampling=GREEDY))
    assert sink.wait().last == ContextDone(sink.last.context, "length_rule", 4)      # at least 4 frames
    st = engine.stats()
    assert st["steps"] > 0 and st["frames"] > 0 and st["running"] == 0 and st["free_slots"] == 4


def test_text_rule_end_after_the_frames_ran_ahead(engine):
    """Digits are a token each: while the text is open, frames follow the tokens past the length the text
    rule gives the text so far; when the text ends the context ends with the audio it has."""
    from talkgate.synth.engine import frames_for_text
    text = "1234567890" * 4
    ctx, sink = speak(engine, [text], ContextParams(sampling=GREEDY), end=False)
    deadline = time.time() + 30
    while len(sink.chunks) <= frames_for_text(text) and time.time() < deadline:
        time.sleep(0.01)
    assert len(sink.chunks) > frames_for_text(text) == 30
    engine.end_text(ctx)
    last = sink.wait().last
    assert last.reason == "length_rule" and last.frames == len(sink.chunks) <= len(text) + 2


@pytest.fixture(scope="module")
def runaway(checkpoint):
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=2, max_frames_per_context=120,
                                 untrained_length="runaway")
    eng.start()
    yield eng
    eng.stop()


def test_runaway_choice_runs_to_the_guard(runaway):
    assert runaway.info.end_of_speech == "runaway_guard" and runaway.info.as_dict()["end_of_speech"] == "runaway_guard"
    # random weights rarely sample eos, so the runaway guard ends it
    _, sink = speak(runaway, ["Hi."], ContextParams(sampling=GREEDY))
    last = sink.wait().last
    assert last.reason in ("budget", "eos")
    if last.reason == "budget":
        assert last.frames == 50                           # max(4 * frames_for_text("Hi."), 50)


def test_trained_checkpoint_ends_by_the_model(checkpoint, tmp_path):
    """A checkpoint not marked untrained is unaffected: eos or the runaway guard, as the model goes."""
    import json
    import shutil
    d = shutil.copytree(checkpoint, tmp_path / "trained")
    config = json.loads((d / "config.json").read_text())
    del config["talkgate"]
    (d / "config.json").write_text(json.dumps(config))
    eng = Engine.from_pretrained(str(d), device="cpu", max_contexts=1, max_frames_per_context=120)
    assert not eng.info.untrained and eng.info.end_of_speech == "model"
    eng.start()
    try:
        _, sink = speak(eng, ["Hi."], ContextParams(sampling=GREEDY))
        last = sink.wait().last
        assert last.reason == ("budget" if last.frames == 50 else "eos") and last.frames <= 50
        _, sink = speak(eng, ["Hi."], ContextParams(sampling=GREEDY, fixed_frames=6))
        assert sink.wait().last == ContextDone(sink.last.context, "length", 6)
    finally:
        eng.stop()


def test_engine_equals_offline_synthesis(engine, checkpoint):
    from talkgate.synth.loader import load_tts
    from talkgate.synth.offline import synthesize
    text = "Hi there, this is offline."
    tts = load_tts(checkpoint)
    wav, _ = synthesize(tts, text, voice="ryan", sampling=GREEDY)
    _, sink = speak(engine, [text], ContextParams(voice="ryan", sampling=GREEDY))
    last = sink.wait().last
    assert last == ContextDone(last.context, "length_rule", 20) and last.frames * 1920 == len(wav)
    np.testing.assert_allclose(sink.pcm, wav, atol=1e-5)
    wav, _ = synthesize(tts, text, voice="ryan", sampling=GREEDY, max_frames=7)
    assert len(wav) == 7 * 1920
