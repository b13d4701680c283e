"""The streaming engine on CPU with the tiny random checkpoint (fp32, greedy where outputs are compared)."""
from __future__ import annotations

import collections
import itertools
import threading
import time

import numpy as np
import pytest

from talkgate.synth.api import (
    ENGINE_STAGES, AppendText, AudioChunk, CancelContext, ContextDone, ContextFailed, ContextParams, EndText,
    OpenContext, SamplingParams, StageTimes,
)
from talkgate.synth.checkpoint import create_checkpoint
from talkgate.synth.engine import STEP_MEAN_STEPS, Engine, first_frames_apart, mean_step_ms
from talkgate.synth.request import Request, text_seconds
from tests.speaker import Collector, Speaker

GREEDY = SamplingParams(greedy=True)
TEXT = "Hello there, this is a streaming test. It has two sentences!"
# contexts spoken side by side: the seeds tell them apart (the tiny random model hardly hears its text)
SIDE_BY_SIDE = [("One two three.", GREEDY), ("A different sentence here", SamplingParams(seed=1)),
                (TEXT, SamplingParams(seed=2))]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


@pytest.fixture(scope="module")
def engine(checkpoint):
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=4, max_frames_per_context=120)
    eng.start()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def speaker(engine):
    s = Speaker(engine)
    yield s
    engine.disconnect(s.id)


def speak(speaker, deltas, params=None, end=True):
    sink = Collector()
    ctx = speaker.open(params or ContextParams(sampling=GREEDY, fixed_frames=12), sink)
    for d in deltas:
        speaker.append(ctx, d)
    if end:
        speaker.end(ctx)
    return ctx, sink


def test_fixed_frames_honoured(speaker):
    _, sink = speak(speaker, [TEXT], ContextParams(sampling=SamplingParams(seed=1), fixed_frames=9))
    sink.wait()
    assert [c.first_frame for c in sink.chunks] == list(range(9))
    assert all(c.pcm.shape == (1920,) and c.pcm.dtype == np.float32 for c in sink.chunks)
    assert all(0 < c.step_s < 60 for c in sink.chunks)     # the engine's step when each was handed over (a hold's scale)
    assert sink.last == ContextDone(sink.last.context, "length", 9)


def test_chunks_carry_a_running_mean_of_the_step():
    """A context's frame 0 is handed over after the step that prefilled it, a long one: the step its chunk carries
    (a lone first token's hold scales with it) moves by an eighth of that step's excess, not to it."""
    mean = 0.0
    for steps in range(1, 41):
        mean = mean_step_ms(mean, 5.0, steps)
    assert mean == 5.0                                      # the first step sets it; equal steps keep it
    assert mean_step_ms(mean, 13.0, 41) == pytest.approx(5.0 + 8.0 / STEP_MEAN_STEPS) == pytest.approx(6.0)
    for steps in range(41, 81):                             # under load it follows the steps (16 ms at 512 streams)
        mean = mean_step_ms(mean, 16.0, steps)
    assert mean == pytest.approx(16.0, abs=0.1)


def test_streamed_deltas_equal_whole_text(speaker):
    _, whole = speak(speaker, [TEXT])
    pieces = [TEXT[i:i + 3] for i in range(0, len(TEXT), 3)]
    _, streamed = speak(speaker, pieces)
    whole.wait(), streamed.wait()
    assert len(whole.chunks) == 12
    np.testing.assert_allclose(whole.pcm, streamed.pcm, atol=1e-5)   # run side by side: batch 2 vs 1


def test_batching_invariance(speaker):
    """Contexts side by side give what each gives alone (greedy, and seeded sampling: the noise is a
    function of seed and frame, never of the batch). The tiny random model hardly hears its text, so
    the seeds are what tells these contexts apart."""
    alone = []
    for text, sampling in SIDE_BY_SIDE:
        _, s = speak(speaker, [text], ContextParams(sampling=sampling, fixed_frames=12))
        alone.append(s.wait().pcm)
    together = [speak(speaker, [text], ContextParams(sampling=sampling, fixed_frames=12), end=False)
                for text, sampling in SIDE_BY_SIDE]
    for ctx, _ in together:
        speaker.end(ctx)
    for (_, s), ref in zip(together, alone):
        np.testing.assert_allclose(s.wait().pcm, ref, atol=1e-5)
    assert not np.allclose(alone[1], alone[2], atol=1e-3)


def test_seeded_sampling_is_reproducible_and_batch_independent(speaker):
    p = ContextParams(sampling=SamplingParams(seed=7), fixed_frames=10)
    _, a = speak(speaker, [TEXT], p)
    a.wait()
    _, b = speak(speaker, [TEXT], p)
    _, other = speak(speaker, ["Something else entirely."], ContextParams(sampling=SamplingParams(seed=8), fixed_frames=10))
    np.testing.assert_allclose(b.wait().pcm, a.pcm, atol=1e-5)
    other.wait()


def test_default_seed_makes_unseeded_contexts_reproducible(checkpoint, speaker):
    unseeded = ContextParams(fixed_frames=8)
    seeded = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=2, max_frames_per_context=120,
                                    default_seed=11)
    seeded.start()
    try:
        other = Speaker(seeded)
        _, a = speak(other, [TEXT], unseeded)
        _, b = speak(other, [TEXT], unseeded)
        np.testing.assert_allclose(b.wait().pcm, a.wait().pcm, atol=1e-5)
        _, own = speak(other, [TEXT], ContextParams(sampling=SamplingParams(seed=12), fixed_frames=8))
        assert not np.allclose(own.wait().pcm, a.pcm, atol=1e-3)        # a context's own seed wins
    finally:
        seeded.stop()
    _, fresh = speak(speaker, [TEXT], unseeded)                           # no default: a fresh seed each
    _, fresh2 = speak(speaker, [TEXT], unseeded)
    assert not np.allclose(fresh.wait().pcm, fresh2.wait().pcm, atol=1e-3)


def test_seed_range_and_a_failed_slot_fails_only_its_context(speaker):
    for seed in (1 << 64, -(1 << 63) - 1):
        _, refused = speak(speaker, [], ContextParams(sampling=SamplingParams(seed=seed)), end=False)
        last = refused.wait().last
        assert isinstance(last, ContextFailed) and last.code == "invalid_params" and "64 bits" in last.message
    # an unsigned 64-bit seed is the signed one of the same bits
    p = [ContextParams(sampling=SamplingParams(seed=s), fixed_frames=4) for s in ((1 << 64) - 1, -1)]
    _, big = speak(speaker, [TEXT], p[0])
    _, minus_one = speak(speaker, [TEXT], p[1])
    np.testing.assert_allclose(big.wait().pcm, minus_one.wait().pcm, atol=1e-5)
    # a value the slot's tensors cannot hold (the Python API checks no ranges): that context fails, the
    # engine thread goes on
    _, bad = speak(speaker, [TEXT], ContextParams(sampling=SamplingParams(top_k=1 << 70), fixed_frames=4))
    assert isinstance(bad.wait().last, ContextFailed)
    _, after = speak(speaker, [TEXT])
    assert len(after.wait().chunks) == 12


def test_waiting_context_does_not_block_others(speaker):
    ctx_wait, waiting = speak(speaker, [], end=False)     # no text yet: nothing to compute
    _, other = speak(speaker, [TEXT])
    other.wait()
    assert len(other.chunks) == 12 and waiting.events == []
    speaker.append(ctx_wait, "Now it comes.")
    speaker.end(ctx_wait)
    assert len(waiting.wait().chunks) == 12


def test_held_engine_steps_nothing_until_released(engine, speaker):
    """Engine.hold (the gateway's event loop is behind) stops steps, not contexts: nothing is lost."""
    held = threading.Event()
    held.set()
    engine.hold = held.is_set
    try:
        _, sink = speak(speaker, [TEXT])
        time.sleep(0.3)
        assert sink.events == []
        held.clear()
        assert sink.wait().last.reason == "length" and len(sink.chunks) == 12
    finally:
        engine.hold = None


def test_context_waits_for_its_next_token(speaker):
    """With text still open, a context cannot run ahead of its committed tokens (one token a frame)."""
    ctx, sink = speak(speaker, ["Hello there "], ContextParams(sampling=GREEDY, fixed_frames=40), end=False)
    time.sleep(0.5)
    n = len(sink.chunks)
    assert 1 <= n <= 3                                      # "Hello", " there": at most a token per frame
    speaker.end(ctx)
    assert sink.wait().last.reason == "length" and len(sink.chunks) == 40


def test_cancel_mid_utterance_then_slot_reused(speaker):
    params = ContextParams(sampling=GREEDY, fixed_frames=120)
    late = []
    cancelled = threading.Event()

    class Sink(Collector):
        def __call__(self, ev):
            if cancelled.is_set():
                late.append(ev)
            super().__call__(ev)

    sink = Sink()
    ctx = speaker.open(params, sink)
    speaker.append(ctx, TEXT * 3)
    speaker.end(ctx)
    deadline = time.time() + 30
    while len(sink.chunks) < 3 and time.time() < deadline:
        time.sleep(0.005)
    speaker.cancel(ctx)
    cancelled.set()
    speaker.cancel(ctx)                                     # idempotent
    time.sleep(0.3)
    # nothing is made after the cancel; a frame made before it may still be on its way (the client drops it)
    assert len(late) <= 1 and all(isinstance(e, AudioChunk) for e in late) and 3 <= len(sink.chunks) < 120
    assert not any(isinstance(e, ContextDone) for e in sink.events)
    # all slots usable again
    runs = [speak(speaker, [TEXT]) for _ in range(4)]
    for _, s in runs:
        assert s.wait().last.reason == "length"


def test_engine_full_when_out_of_slots(speaker):
    opened = [speak(speaker, [], end=False) for _ in range(4)]
    _, refused = speak(speaker, [], ContextParams(), end=False)
    assert refused.wait().last.code == "engine_full"
    for ctx, _ in opened:
        speaker.cancel(ctx)
    ctx, sink = speak(speaker, [TEXT])
    assert sink.wait().last.reason == "length"


def test_empty_text_ends_at_once(speaker):
    _, sink = speak(speaker, [])
    assert sink.wait().last == ContextDone(sink.last.context, "eos", 0)


def test_untrained_ends_by_the_text_rule_and_stats(engine, speaker):
    """An untrained checkpoint (random weights never sample eos usefully): a context without fixed_frames
    ends where the text-length rule puts it for the text it received, streamed deltas included."""
    from talkgate.synth.request import frames_for_text
    assert engine.info.untrained and engine.info.end_of_speech == "text_length_rule"
    deltas = ["Hello there, ", "this is streamed ", "in three parts."]
    _, sink = speak(speaker, deltas, ContextParams(sampling=SamplingParams(seed=3)))
    want = frames_for_text("".join(deltas))
    assert want == 34 and sink.wait().last == ContextDone(sink.last.context, "length_rule", want)
    assert [c.first_frame for c in sink.chunks] == list(range(want))
    _, sink = speak(speaker, ["Hi."], ContextParams(sampling=GREEDY))
    assert sink.wait().last == ContextDone(sink.last.context, "length_rule", 4)      # at least 4 frames
    st = engine.stats()
    assert st["steps"] > 0 and st["frames"] > 0 and st["running"] == 0 and st["free_slots"] == 4


def test_text_rule_end_after_the_frames_ran_ahead(speaker):
    """Digits are a token each: while the text is open, frames follow the tokens past the length the text
    rule gives the text so far; when the text ends the context ends with the audio it has."""
    from talkgate.synth.request import frames_for_text
    text = "1234567890" * 4
    ctx, sink = speak(speaker, [text], ContextParams(sampling=GREEDY), end=False)
    deadline = time.time() + 30
    while len(sink.chunks) <= frames_for_text(text) and time.time() < deadline:
        time.sleep(0.01)
    assert len(sink.chunks) > frames_for_text(text) == 30
    speaker.end(ctx)
    last = sink.wait().last
    assert last.reason == "length_rule" and last.frames == len(sink.chunks) <= len(text) + 2


@pytest.fixture(scope="module")
def runaway(checkpoint):
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=2, max_frames_per_context=120,
                                 untrained_length="runaway")
    eng.start()
    yield Speaker(eng)
    eng.stop()


def test_runaway_choice_runs_to_the_guard(runaway):
    info = runaway.engine.info
    assert info.end_of_speech == "runaway_guard" and info.as_dict()["end_of_speech"] == "runaway_guard"
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
        trained = Speaker(eng)
        _, sink = speak(trained, ["Hi."], ContextParams(sampling=GREEDY))
        last = sink.wait().last
        assert last.reason == ("budget" if last.frames == 50 else "eos") and last.frames <= 50
        _, sink = speak(trained, ["Hi."], ContextParams(sampling=GREEDY, fixed_frames=6))
        assert sink.wait().last == ContextDone(sink.last.context, "length", 6)
    finally:
        eng.stop()


def test_engine_equals_offline_synthesis(speaker, checkpoint):
    from talkgate.synth.loader import load_tts
    from talkgate.synth.offline import synthesize
    text = "Hi there, this is offline."
    tts = load_tts(checkpoint)
    wav, _ = synthesize(tts, text, voice="ryan", sampling=GREEDY)
    _, sink = speak(speaker, [text], ContextParams(voice="ryan", sampling=GREEDY))
    last = sink.wait().last
    assert last == ContextDone(last.context, "length_rule", 20) and last.frames * 1920 == len(wav)
    np.testing.assert_allclose(sink.pcm, wav, atol=1e-5)
    wav, _ = synthesize(tts, text, voice="ryan", sampling=GREEDY, max_frames=7)
    assert len(wav) == 7 * 1920


# ----- the command boundary: connect / submit / disconnect -----
class Client:
    """A client of Engine.connect: records each delivered batch; `done` per context id."""

    def __init__(self, engine):
        self.engine, self.batches, self.lock = engine, [], threading.Lock()
        self.finished: dict[int, threading.Event] = collections.defaultdict(threading.Event)
        self.id = engine.connect(self.deliver)

    def deliver(self, events):
        assert threading.current_thread().name == "talkgate-engine"
        with self.lock:
            self.batches.append(list(events))
        for ev in events:
            if not isinstance(ev, AudioChunk):
                self.finished[ev.context].set()

    def events(self, context):
        with self.lock:
            return [ev for batch in self.batches for ev in batch if ev.context == context]

    def pcm(self, context):
        return np.concatenate([ev.pcm for ev in self.events(context) if isinstance(ev, AudioChunk)])

    def wait(self, context, timeout=60.0):
        assert self.finished[context].wait(timeout), f"context {context} did not finish"
        return self.events(context)[-1]

    def say(self, context, text, params=None, end=True):
        tok = self.engine.new_tokenizer()
        cmds = [OpenContext(context, params or ContextParams(sampling=GREEDY, fixed_frames=12)),
                AppendText(context, tuple(tok.feed(text)), text_seconds(text))]
        if end:
            cmds.append(EndText(context, tuple(tok.finish())))
        self.engine.submit(self.id, cmds)


def test_deltas_in_any_pieces_speak_alike(engine, speaker):
    """Token ids from deltas cut anywhere, sent in several submits, give the audio of the whole text."""
    _, ref = speak(speaker, [TEXT])
    c = Client(engine)
    try:
        tok = engine.new_tokenizer()
        cmds = [OpenContext(5, ContextParams(sampling=GREEDY, fixed_frames=12))]
        cmds += [AppendText(5, tuple(tok.feed(TEXT[i:i + 7])), text_seconds(TEXT[i:i + 7]))
                 for i in range(0, len(TEXT), 7)]
        engine.submit(c.id, cmds)
        engine.submit(c.id, [EndText(5, tuple(tok.finish()))])
        assert c.wait(5) == ContextDone(5, "length", 12)
        np.testing.assert_allclose(c.pcm(5), ref.wait().pcm, atol=1e-5)
    finally:
        engine.disconnect(c.id)


def test_one_delivery_per_step_per_client_and_ids_are_per_client(engine):
    """Two clients each use context ids 1 and 2: contexts are keyed by (client, id). Each deliver call
    carries at most one event per context (one step's), and a client's contexts share calls."""
    a, b = Client(engine), Client(engine)
    try:
        seeds = {(a, 1): 1, (a, 2): 2, (b, 1): 3, (b, 2): 4}
        for (client, ctx), seed in seeds.items():
            client.say(ctx, TEXT, ContextParams(sampling=SamplingParams(seed=seed), fixed_frames=10), end=False)
        for client in (a, b):
            engine.submit(client.id, [EndText(1), EndText(2)])
        for (client, ctx) in seeds:
            assert client.wait(ctx) == ContextDone(ctx, "length", 10)
        for client in (a, b):
            for batch in client.batches:
                audio = [ev.context for ev in batch if isinstance(ev, AudioChunk)]
                assert len(audio) == len(set(audio))
            assert any(len(batch) == 2 for batch in client.batches)     # both contexts in one step's call
        pcms = [client.pcm(ctx) for client, ctx in seeds]
        assert all(p.shape == (10 * 1920,) for p in pcms)
        assert not np.allclose(pcms[0], pcms[2], atol=1e-3)            # (a, 1) and (b, 1) are not mixed up
        alone = Client(engine)
        alone.say(1, TEXT, ContextParams(sampling=SamplingParams(seed=3), fixed_frames=10))
        alone.wait(1)
        np.testing.assert_allclose(alone.pcm(1), pcms[2], atol=1e-5)
        engine.disconnect(alone.id)
    finally:
        engine.disconnect(a.id), engine.disconnect(b.id)


def test_refused_opens_come_back_as_events(engine):
    c = Client(engine)
    try:
        engine.submit(c.id, [OpenContext(1, ContextParams(voice="nobody")),
                             OpenContext(2, ContextParams(language="klingon")),
                             OpenContext(3, ContextParams(sampling=SamplingParams(seed=1 << 64))),
                             OpenContext(4, ContextParams(fixed_frames=0))])
        codes = {ctx: c.wait(ctx).code for ctx in (1, 2, 3, 4)}
        assert codes == {1: "unknown_voice", 2: "unknown_language", 3: "invalid_params", 4: "invalid_params"}
        engine.submit(c.id, [OpenContext(ctx, ContextParams()) for ctx in range(10, 14)])   # every slot
        engine.submit(c.id, [OpenContext(10, ContextParams()), OpenContext(14, ContextParams())])
        assert c.wait(14) == ContextFailed(14, "engine_full", "all 4 context slots are in use")
        duplicate = [ev for ev in c.events(10) if isinstance(ev, ContextFailed)]
        assert [ev.code for ev in duplicate] == ["invalid_params"] and "already open" in duplicate[0].message
        assert engine.stats()["free_slots"] == 0
        engine.submit(c.id, [AppendText(99, (1, 2), 0.1), EndText(98), CancelContext(97)])  # not open: ignored
        engine.submit(c.id, [CancelContext(ctx) for ctx in range(10, 14)])
        assert engine.stats()["free_slots"] == 4
    finally:
        engine.disconnect(c.id)


def test_cancel_stops_the_context_within_a_step_and_frees_its_slot(engine):
    c = Client(engine)
    try:
        c.say(1, TEXT * 3, ContextParams(sampling=GREEDY, fixed_frames=120))
        deadline = time.time() + 30
        while len(c.events(1)) < 3 and time.time() < deadline:
            time.sleep(0.005)
        free = engine.stats()["free_slots"]
        engine.submit(c.id, [CancelContext(1)])
        assert engine.stats()["free_slots"] == free + 1            # at once
        n = len(c.events(1))
        c.say(2, TEXT)
        assert c.wait(2) == ContextDone(2, "length", 12)
        late = c.events(1)[n:]                                  # made before the cancel, delivered after it
        assert len(late) <= 1 and all(isinstance(ev, AudioChunk) for ev in late)
        assert not any(isinstance(ev, ContextDone) for ev in c.events(1))
    finally:
        engine.disconnect(c.id)


def test_disconnect_frees_every_slot_and_delivers_nothing_more(engine, speaker):
    c = Client(engine)
    for ctx in (1, 2, 3):
        c.say(ctx, TEXT, ContextParams(sampling=GREEDY, fixed_frames=120))
    deadline = time.time() + 30
    while not c.batches and time.time() < deadline:
        time.sleep(0.005)
    engine.disconnect(c.id)
    n = len(c.batches)
    assert engine.stats()["free_slots"] == 4
    time.sleep(0.3)
    assert len(c.batches) == n
    engine.submit(c.id, [OpenContext(1, ContextParams())])     # a gone client: ignored
    _, sink = speak(speaker, [TEXT])
    assert sink.wait().last.reason == "length"


def test_a_client_whose_deliver_raises_is_disconnected_alone(engine):
    def broken(events):
        raise RuntimeError("a bug in this client")

    clients = engine.stats()["clients"]
    bad = engine.connect(broken)
    good = Client(engine)
    try:
        engine.submit(bad, [OpenContext(1, ContextParams(sampling=GREEDY, fixed_frames=100)),
                            EndText(1, tuple(engine.new_tokenizer().feed(TEXT)), 1.0)])
        good.say(1, TEXT)
        assert good.wait(1) == ContextDone(1, "length", 12)
        st = engine.stats()                                     # bad's 100 frames were cancelled at its first
        assert st["clients"] == clients + 1 and st["free_slots"] == 4 and st["running"] == 0
    finally:
        engine.disconnect(good.id)


def test_opens_of_one_step_fail_alone(engine):
    """Contexts opened at one step boundary share their slots' initialization; one that cannot be initialized
    (a top_k its slot's tensor cannot hold: the Python API checks no ranges) fails alone, the others speak."""
    c = Client(engine)
    try:
        bad = ContextParams(sampling=SamplingParams(top_k=1 << 70), fixed_frames=4)
        good = ContextParams(sampling=SamplingParams(seed=5), fixed_frames=4)
        tok = engine.new_tokenizer()
        ids = (*tok.feed(TEXT), *tok.finish())
        engine.submit(c.id, [OpenContext(1, good), OpenContext(2, bad), OpenContext(3, good),
                             *(EndText(ctx, ids, text_seconds(TEXT)) for ctx in (1, 2, 3))])
        assert isinstance(c.wait(2), ContextFailed)
        assert c.wait(1) == ContextDone(1, "length", 4) and c.wait(3) == ContextDone(3, "length", 4)
        np.testing.assert_allclose(c.pcm(1), c.pcm(3), atol=1e-5)            # same seed, same text
        assert engine.stats()["free_slots"] == engine.runner.num_slots
    finally:
        engine.disconnect(c.id)


def test_a_traced_context_reports_its_first_frame_stages_once_and_others_none(engine):
    """ContextParams.trace_latency: one StageTimes, just before the first AudioChunk, every ENGINE_STAGES time in
    order (time.monotonic_ns, after the submit); an untraced context of the same steps gets none."""
    c = Client(engine)
    try:
        t0 = time.monotonic_ns()
        c.say(1, TEXT, ContextParams(sampling=GREEDY, fixed_frames=6, trace_latency=True))
        c.say(2, TEXT, ContextParams(sampling=GREEDY, fixed_frames=6))
        c.wait(1), c.wait(2)
        traced = c.events(1)
        times = [ev for ev in traced if isinstance(ev, StageTimes)]
        assert len(times) == 1 and isinstance(traced[traced.index(times[0]) + 1], AudioChunk)
        assert traced[traced.index(times[0]) + 1].first_frame == 0
        stamps = times[0].stamps
        assert len(stamps) == len(ENGINE_STAGES) and t0 <= stamps[0] and stamps == sorted(stamps)
        assert not any(isinstance(ev, StageTimes) for ev in c.events(2))
    finally:
        engine.disconnect(c.id)


def test_first_frames_apart_only_while_every_running_client_has_audio_to_spare():
    """first_frames_apart: a new context's first frame goes ahead of the running rows' only while each
    running context's audio lasts FIRST_APART_STEPS of the last step's length beyond now."""
    from types import SimpleNamespace

    from talkgate.synth.engine import FIRST_APART_MAX_ROWS, FIRST_APART_STEPS, first_frames_apart

    step = 0.02
    ahead, near = SimpleNamespace(deadline=10.001 + FIRST_APART_STEPS * step), SimpleNamespace(deadline=10.03)
    assert first_frames_apart([ahead], 10.0, step)
    assert not first_frames_apart([ahead, near], 10.0, step)
    assert first_frames_apart([ahead, near], 10.0, 0.01)
    # and only while the running rows are few enough that the pass of the new rows costs little of the capacity
    assert first_frames_apart([ahead] * FIRST_APART_MAX_ROWS, 10.0, step)
    assert not first_frames_apart([ahead] * (FIRST_APART_MAX_ROWS + 1), 10.0, step)


def far_ahead(engine) -> bool:
    """The engine's rule for launching first frames apart (first_frames_apart) holds for its running contexts a step
    from now. Eight frames were not always enough: where a CPU step takes most of a frame's 80 ms, the running
    context was 32 ms ahead of its client, or 69 ms behind, after them (a 2-core machine)."""
    step_s = engine._step_ms_last / 1000
    running = list(engine.scheduler.running)
    return bool(running) and first_frames_apart(running, time.perf_counter() + step_s, step_s)


def first_frame_calls(engine) -> tuple[list[list[int]], dict]:
    """A context (2) opened while another (1) runs far ahead of its client: the contexts of each delivered call's
    AudioChunks, and both contexts' audio."""
    c = Client(engine)
    try:
        c.say(1, TEXT, ContextParams(sampling=GREEDY, fixed_frames=60))
        until = time.monotonic() + 30
        while True:
            frames = sum(isinstance(ev, AudioChunk) for ev in c.events(1))
            if frames >= 8 and (not engine.first_apart or far_ahead(engine)):
                break
            if frames >= 40 or time.monotonic() > until:    # a third of its frames left: open the second now, or never
                pytest.skip("this machine's CPU engine made frames slower than real time: the running context never "
                            "got ahead of its client, which first frames apart need")
            time.sleep(0.002)
        apart = engine.stats()["first_apart_launches"]
        c.say(2, "A second voice starts here.", ContextParams(sampling=GREEDY, fixed_frames=6))
        c.wait(1), c.wait(2)
        if engine.first_apart and engine.stats()["first_apart_launches"] == apart:
            pytest.skip("the running context was far ahead when the second was opened but no longer when the engine "
                        "took it (a slow step on a loaded machine): its first frame went with the running one's")
        with c.lock:
            chunks = [[ev.context for ev in batch if isinstance(ev, AudioChunk)] for batch in c.batches]
        return chunks, {ctx: c.pcm(ctx) for ctx in (1, 2)}
    finally:
        engine.disconnect(c.id)


def test_a_new_contexts_first_frame_goes_out_before_the_running_contexts_next_frame(engine, checkpoint):
    """A context opened while another runs far ahead of its client: its prefill and frame 0 are launched apart,
    ahead of the running context's frame, and delivered in a call of their own before that frame's audio; the
    audio of both is what they make started together in one step. An engine told not to (first_apart=False:
    engine processes sharing a GPU) makes both frames in one step, as before."""
    together = Client(engine)
    try:
        together.say(1, TEXT, ContextParams(sampling=GREEDY, fixed_frames=60))
        together.say(2, "A second voice starts here.", ContextParams(sampling=GREEDY, fixed_frames=6))
        together.wait(1), together.wait(2)
        reference = {1: together.pcm(1), 2: together.pcm(2)}
    finally:
        engine.disconnect(together.id)
    chunks, pcm = first_frame_calls(engine)                     # the engine launched frame 0 apart
    first = next(i for i, batch in enumerate(chunks) if 2 in batch)
    assert chunks[first] == [2]                                 # frame 0 alone in its call
    assert 1 in chunks[first + 1]                               # then the running context's frame
    assert sum(1 in batch for batch in chunks[first:]) > 1      # which was still running
    for ctx in (1, 2):
        np.testing.assert_allclose(pcm[ctx], reference[ctx], atol=1e-5)
    in_one_step = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=4, max_frames_per_context=120,
                                         first_apart=False)
    in_one_step.start()
    try:
        chunks, pcm = first_frame_calls(in_one_step)
    finally:
        in_one_step.stop()
    assert sorted(next(batch for batch in chunks if 2 in batch)) == [1, 2]
    assert in_one_step.stats()["first_apart_launches"] == 0
    for ctx in (1, 2):
        np.testing.assert_allclose(pcm[ctx], reference[ctx], atol=1e-5)


def test_opens_of_one_step_boundary_set_each_slot_from_its_own_params(checkpoint):
    """A step boundary's opens go to the slots in chunks of runner.OPEN_ROWS[-1] contexts (20: a chunk of 16 and one
    of 4), each slot's sampling values, eos frame and history from its own params, none from a neighbour's."""
    from talkgate.synth.runner import EOS_FROM, NO_EOS, OPEN_ROWS
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=20, max_frames_per_context=32,
                                 untrained_length="runaway")      # the model's eos may end a context: fixed_frames decides
    n = 20
    assert n > OPEN_ROWS[-1]
    r = eng.runner
    r.seen.fill_(True)                                      # what a slot's last context left
    params = [ContextParams(sampling=SamplingParams(seed=1000 + i, temperature=0.5 + i / 100, top_k=10 + i,
                                                    top_p=0.9 - i / 100, repetition_penalty=1.0 + i / 50,
                                                    greedy=i % 3 == 0),
                            fixed_frames=5 if i % 2 else None) for i in range(n)]
    client = eng.connect(lambda events: None)
    eng.submit(client, [OpenContext(i, p) for i, p in enumerate(params)])
    eng._apply_commands()
    reqs = eng._clients[client].contexts
    for i, p in enumerate(params):
        slot, s = reqs[i].slot, p.sampling
        assert r.sampling.seed[slot] == 1000 + i and r.sampling.top_k[slot] == 10 + i
        assert r.sampling.temperature[slot].item() == pytest.approx(0.5 + i / 100)
        assert r.sampling.top_p[slot].item() == pytest.approx(0.9 - i / 100)
        assert r.sampling.repetition_penalty[slot].item() == pytest.approx(1.0 + i / 50)
        assert bool(r.sampling.greedy[slot]) == s.greedy and bool(r.sampling.sub_greedy[slot]) == s.greedy
        assert r.min_frames[slot] == (NO_EOS if i % 2 else EOS_FROM)
        assert not r.seen[slot].any()
    eng.disconnect(client)


def test_steps_add_their_roofline_seconds_where_the_gpus_peaks_are_known(checkpoint):
    """runner.roof (load_runner sets it on a GPU in synth.roofline.GPU_PEAKS; none on a CPU): each step adds the
    roofline seconds of its rows and new contexts' prefills to stats()["step_roof_s"], which is absent without it."""
    import torch

    from talkgate.synth.roofline import H200, StepRoof
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=4, max_frames_per_context=32)
    assert eng.runner.roof is None and "step_roof_s" not in eng.stats()
    tts = eng.runner.tts
    eng.runner.roof = roof = StepRoof(tts.config, tts.codec_decoder.config, torch.float32, torch.float32, H200,
                                      cuda=False)
    assert 0 < roof.step_s(1, 20) < roof.step_s(4, 20) < roof.step_s(4, 20, [16]) and roof.step_s(0, 0) == 0.0
    client = eng.connect(lambda events: None)
    ids = tuple(eng.new_tokenizer().tokenizer.encode("Two contexts."))
    eng.submit(client, [cmd for i in range(2) for cmd in (OpenContext(i, ContextParams(fixed_frames=3)),
                                                          EndText(i, ids, 1.0))])
    eng.run_once()          # frame 0: a Talker step at the prompt's last position (its prefix was set at the open)
    first = eng.stats()["step_roof_s"]
    assert all(r.prefixed for r in eng.scheduler.running)
    assert first == pytest.approx(roof.step_s(2, sum(r.prompt_len - 1 for r in eng.scheduler.running) / 2, []))
    while eng.scheduler.running:
        eng.run_once()
    stats = eng.stats()
    assert first < stats["step_roof_s"] < stats["step_ms_avg"] * stats["steps"] / 1000    # a CPU is far below it
    eng.disconnect(client)


def test_prompt_prefixes_are_kept_and_their_contexts_speak_as_with_the_whole_prefill(checkpoint, monkeypatch):
    """A prompt's positions but its last are kept from its first context on (synth/runner.py, prompt prefixes): its
    first context has them prefilled at its open, a later one copies them there, and both make frame 0 with a Talker
    step: the same audio, and within rounding offline synthesis' (the whole prompt prefilled with its text, as the
    reference does it). Here two prompts are kept (the least recently used makes room) of at most 8 + 1 positions:
    a prompt with a language is 10 and is prefilled whole at its first step. Two new contexts of one new prompt in
    one step boundary each have it prefilled."""
    from talkgate.synth import runner as runner_module
    from talkgate.synth.loader import load_tts
    from talkgate.synth.offline import synthesize
    monkeypatch.setattr(runner_module, "PREFIX_ENTRIES", 2)
    monkeypatch.setattr(runner_module, "PREFIX_POSITIONS", 8)
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=2, max_frames_per_context=32)
    events, firsts = [], []                     # firsts: per step with new contexts, whether each was prefixed
    launch = eng.runner.launch

    def seen_launch(new, old, *how):
        if new:
            firsts.append([r.prefixed for r in new])
        return launch(new, old, *how)
    monkeypatch.setattr(eng.runner, "launch", seen_launch)
    client = eng.connect(events.extend)
    ids = tuple(eng.new_tokenizer().tokenizer.encode(TEXT))
    contexts = itertools.count()

    def say(*params: ContextParams, text_later=False) -> list[np.ndarray]:
        ctxs = [next(contexts) for _ in params]
        eng.submit(client, [OpenContext(ctx, p) for ctx, p in zip(ctxs, params)])
        if text_later:
            eng.run_once()                      # opened, waiting for its text
        eng.submit(client, [EndText(ctx, ids, 1.0) for ctx in ctxs])
        while not all(any(e.context == ctx and not isinstance(e, AudioChunk) for e in events) for ctx in ctxs):
            eng.run_once()
        assert [e for e in events if e.context in ctxs and not isinstance(e, AudioChunk)] == [
            ContextDone(ctx, "length", 8) for ctx in ctxs]
        return [np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk) and e.context == ctx])
                for ctx in ctxs]

    def voice(name, language=None):
        return ContextParams(voice=name, language=language, sampling=GREEDY, fixed_frames=8)

    def kept():
        return [(p.voice, p.language) for p in eng.runner._prefixes]

    (a1,) = say(voice("ryan"))                  # its prefix prefilled at its open, then kept
    assert kept() == [("ryan", "auto")] and eng.stats()["prompt_prefixes"] == {"kept": 0, "prefilled": 1}
    (a2,) = say(voice("ryan"))                  # its prefix copied from the store
    np.testing.assert_array_equal(a2, a1)
    (s1,) = say(voice("serena"), text_later=True)   # the text after the open: the same
    (s2,) = say(voice("serena"))
    np.testing.assert_array_equal(s2, s1)
    assert firsts == [[True], [True], [True], [True]]
    assert eng.stats()["prompt_prefixes"] == {"kept": 2, "prefilled": 2}
    say(voice("vivian"))                        # ryan's goes: the least recently used
    assert kept() == [("serena", "auto"), ("vivian", "auto")]
    (a4,) = say(voice("ryan"))
    np.testing.assert_array_equal(a4, a1)
    assert kept() == [("vivian", "auto"), ("ryan", "auto")]
    (english,) = say(voice("ryan", "english"))  # 10 positions: prefilled whole at its first step, not kept
    assert kept() == [("vivian", "auto"), ("ryan", "auto")]
    tts = load_tts(checkpoint)                  # a model of its own: offline synthesis sets its cache
    for got, language in ((a1, "auto"), (english, "english")):
        wav, _ = synthesize(tts, TEXT, voice="ryan", language=language, sampling=GREEDY, max_frames=8)
        np.testing.assert_allclose(got, wav, atol=1e-5)
    one, two = say(voice("aiden"), voice("aiden"))
    # the same speech, within rounding: the two slots' decoder rings hold different stale entries (earlier
    # contexts', masked out), and PyTorch's CPU attention rounds differently by them on some CPUs (an AVX-512 EPYC:
    # 2e-6 from frame 5); the CUDA path's one-frame kernel loads the others as zeros
    np.testing.assert_allclose(one, two, atol=1e-5)
    (three,) = say(voice("aiden"))
    np.testing.assert_allclose(three, one, atol=1e-5)          # alone against side by side: batch 1 vs 2
    assert firsts[-4:] == [[True], [False], [True, True], [True]]
    eng.disconnect(client)


def test_a_slot_whose_last_context_left_nan_in_its_cache_speaks_the_next_as_a_clean_one(checkpoint):
    """A slot's Talker positions past its context's keep the previous occupant's values: the attention's mask hides
    them from the softmax, and must from its arithmetic too (0 x NaN is NaN), so that a context whose values blew up
    cannot garble the next context of its slot (another session's)."""
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=1, max_frames_per_context=40)
    eng.start()
    s = Speaker(eng)
    try:
        _, clean = speak(s, [TEXT])
        clean.wait()
        eng.runner.talker.kv.fill_(float("nan"))
        _, after = speak(s, [TEXT])
        after.wait()
        assert np.isfinite(after.pcm).all()
        np.testing.assert_allclose(after.pcm, clean.pcm, atol=1e-4)
    finally:
        eng.disconnect(s.id)
        eng.stop()


class Timed(Collector):
    """A Collector that notes when each audio chunk came."""

    def __init__(self):
        super().__init__()
        self.times = []

    def __call__(self, ev):
        if isinstance(ev, AudioChunk):
            self.times.append(time.perf_counter())
        super().__call__(ev)


def test_a_paced_context_runs_its_lead_ahead_of_its_player_and_no_further(speaker):
    """An unpaced context first shows the tiny engine faster than real time here (else a lead never binds: skip; on
    the 2-core build machine its frames take ~70 of their 80 ms, and two in a step take more than 80); a paced one of
    lead 0 then has frame k no earlier than its player needs it, and ends at about real time, the engine thread woken
    for each frame when it is due with no command to wake it (not by its idle wait's timeout)."""
    frames, lead = 25, 0.0                                     # 2 s of audio, made exactly in time

    def speak(params):
        sink = Timed()
        ctx = speaker.open(params, sink)
        sent = time.perf_counter()
        speaker.append(ctx, TEXT)
        speaker.end(ctx)
        return sink.wait(), sent

    free, sent = speak(ContextParams(sampling=GREEDY, fixed_frames=frames))
    if free.times[-1] - sent > (frames - 1) * 0.08 - 0.15:
        pytest.skip(f"{frames} frames took {free.times[-1] - sent:.2f} s unpaced: too close to real time for a lead "
                    "to bind")
    sink, sent = speak(ContextParams(sampling=GREEDY, fixed_frames=frames, lead_s=lead))
    assert [c.first_frame for c in sink.chunks] == list(range(frames))
    first = sink.times[0]
    # the engine's player starts when frame 0 can be made, after the text came (frame 0's own step, a prefill, may take
    # longer than a later one's: measured from frame 0's arrival a paced frame 18 came 1.4 ms before its time)
    for k, t in enumerate(sink.times):
        assert t - sent >= k * 0.08 - lead - 0.01, (k, t - sent)
    assert max(b - a for a, b in zip(sink.times, sink.times[1:])) < 0.25     # an idle wait's timeout is 0.5 s
    assert sink.times[-1] - first < (frames - 1) * 0.08 - lead + 0.15


def test_an_idle_engine_touches_its_gpu_every_keep_warm_s_and_a_busy_one_does_not(checkpoint):
    """Driven by hand (not started): an idle turn asks the runner for a touch (Runner.keep_warm) at most once every
    keep_warm_s, idle_s never waits past the next one, and a turn that steps puts the next keep_warm_s after it. On
    the CPU there is nothing to touch (set_keep_warm leaves it off; forced on, the runner touches nothing and the
    count stays 0: it counts touches made)."""
    every = 0.2                                                 # well above a slow CI machine's pauses
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=2, max_frames_per_context=40)
    eng.warm_up()
    eng.set_keep_warm(every)
    assert eng.keep_warm_s is None and eng.idle_s() == pytest.approx(0.5, abs=0.01)
    eng.keep_warm_s = every
    assert eng.idle_s() == 0.0                                  # idle since ever: due now
    assert not eng.turn()
    assert every / 2 < eng.idle_s() <= every                    # asked: the next one keep_warm_s on
    time.sleep(every + 0.01)
    assert eng.idle_s() == 0.0
    assert not eng.turn() and every / 2 < eng.idle_s() <= every
    client = eng.connect(lambda events: None)
    ids = tuple(eng.new_tokenizer().tokenizer.encode("Hi."))
    eng.submit(client, [OpenContext(1, ContextParams(sampling=GREEDY, fixed_frames=3)), EndText(1, ids, 0.3)])
    time.sleep(every + 0.01)
    busy = 0
    while eng.turn():
        busy += 1
    assert busy and every / 2 < eng.idle_s() <= every           # from the last turn that did something
    assert eng.keep_warm_touches == 0 and eng.stats()["keep_warm_touches"] == 0
    eng.keep_warm_s = None
    time.sleep(every + 0.01)
    assert not eng.turn() and eng.idle_s() == pytest.approx(0.5, abs=0.01)


def test_a_lone_new_contexts_first_audio_goes_out_before_its_next_frame_is_launched(checkpoint):
    """Driven by hand: with no context running, a new context's frame 0 is handed out once decoded, before frame 1's
    step is launched (that launch's host work could outlast a one-row decode); a step of running rows hands its audio
    out after the next step's launch, as before (the GPU kept busy)."""
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=2, max_frames_per_context=40)
    eng.warm_up()
    order = []
    launch = eng.runner.launch

    def launch_recorded(*args, **kwargs):
        order.append("launch")
        return launch(*args, **kwargs)

    eng.runner.launch = launch_recorded
    client = eng.connect(lambda events: order.extend(f"audio {ev.first_frame}" for ev in events
                                                     if isinstance(ev, AudioChunk)))
    ids = tuple(eng.new_tokenizer().tokenizer.encode("Hi there."))
    eng.submit(client, [OpenContext(1, ContextParams(sampling=GREEDY, fixed_frames=3)), EndText(1, ids, 0.3)])
    while eng.turn():
        pass
    assert order == ["launch", "audio 0", "launch", "launch", "audio 1", "audio 2"]


def test_contexts_in_fewer_kv_pages_than_their_slots_speak_as_with_whole_slots(checkpoint, speaker):
    """The Talker's KV by use (synth/pages.py): three contexts of 100 frames in an engine of 7 pages of 64 positions
    (4 slots of 320 positions would take 20) take two pages each, handed out as they grow (interleaved, never a slot's
    own run), and speak what each speaks in the engine whose slots hold all their pages."""
    # the references first: a second engine's start races the first's decoder (their process-wide matmul settings)
    alone = []
    for text, sampling in SIDE_BY_SIDE:
        _, s = speak(speaker, [text], ContextParams(sampling=sampling, fixed_frames=100))
        alone.append(s.wait().pcm)
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=4, max_frames_per_context=120,
                                 kv_pages=8)
    assert (eng.runner.page_len, eng.runner.slot_pages, eng.stats()["kv_pages"]) == (64, 4, 7)
    eng.start()
    paged = Speaker(eng)
    try:
        together = [speak(paged, [text], ContextParams(sampling=sampling, fixed_frames=100), end=False)
                    for text, sampling in SIDE_BY_SIDE]
        for ctx, _ in together:
            paged.end(ctx)
        for (_, s), ref in zip(together, alone):
            np.testing.assert_allclose(s.wait().pcm, ref, atol=1e-5)
        deadline = time.monotonic() + 10                # given back at the step after their last
        while eng.stats()["free_kv_pages"] < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert eng.stats()["free_kv_pages"] == 7 and eng.stats()["kv_full_failures"] == 0
    finally:
        eng.disconnect(paged.id)
        eng.stop()


def test_past_the_kv_reserve_the_newest_starved_context_fails_and_new_ones_are_refused(checkpoint):
    """Admission keeps one context's whole length of pages free for the open ones' growth, counting the opens admitted
    but not opened yet (one submit of four: the fourth refused at once, EngineFull); where more contexts grow long at
    once than that allows for, the newest that finds no page fails with engine_full after the audio it made, and its
    pages let the others go on; no new context while only the reserve is free (free_slots 0)."""
    eng = Engine.from_pretrained(str(checkpoint), device="cpu", max_contexts=4, max_frames_per_context=200,
                                 kv_pages=10)
    assert (eng.runner.slot_pages, eng.pages.reserve, eng.pages.free) == (6, 6, 9)
    events = collections.defaultdict(list)
    client = eng.connect(lambda evs: [events[ev.context].append(ev) for ev in evs])
    ids = tuple(eng.new_tokenizer().tokenizer.encode("Three long contexts."))
    eng.submit(client, [cmd for i in (1, 2, 3, 4) for cmd in (OpenContext(i, ContextParams(fixed_frames=190)),
                                                              EndText(i, ids, 1.0))])
    full = ContextFailed(4, "engine_full", "the speech memory is full (the open contexts hold or may grow into every "
                                           "KV page); try again in a moment")
    assert eng.free_slots == 0                                  # three opens queued: only the reserve left for them
    eng.run_once()
    assert events[4] == [full] and eng.pages.free == 6
    for _ in range(600):
        if all(events[i] and isinstance(events[i][-1], (ContextDone, ContextFailed)) for i in (1, 2, 3)):
            break
        eng.run_once()
    assert events[1][-1] == ContextDone(1, "length", 190) and events[2][-1] == ContextDone(2, "length", 190)
    audio3 = [ev for ev in events[3] if isinstance(ev, AudioChunk)]
    failed = events[3][-1]
    assert isinstance(failed, ContextFailed) and failed.code == "engine_full"
    # its frames up to its third page's last position went out, then the failure: nothing made was dropped
    assert [c.first_frame for c in audio3] == list(range(len(audio3))) and 128 < len(audio3) < 190
    assert eng.stats()["kv_full_failures"] == 1
    eng.run_once()
    assert eng.pages.free == 9 and eng.free_slots == 4
    eng.disconnect(client)


def test_a_new_context_that_finds_no_page_for_its_prompt_fails_where_nothing_else_can_go_on(tmp_path):
    """A new context of a long prompt (a designed voice's instruction: two pages), opened within the reserve before its
    text, whose second page is then held by contexts waiting for their clients' text (nothing can run, nothing comes
    back): once its text comes it fails with engine_full instead of waiting for those clients, and its page comes
    back."""
    design = create_checkpoint(tmp_path / "vd", preset="tiny", variant="voice_design", seed=0)
    eng = Engine.from_pretrained(str(design), device="cpu", max_contexts=4, max_frames_per_context=200, kv_pages=10)
    events = collections.defaultdict(list)
    client = eng.connect(lambda evs: [events[ev.context].append(ev) for ev in evs])
    eng.submit(client, [OpenContext(1, ContextParams(instructions="speak slowly and calmly " * 20))])
    eng.run_once()                                              # opened: its prompt's prefix in its first page
    (req,) = eng.scheduler.waiting
    assert req.pages and req.next_position >= 64 and eng.pages.free == 8
    waiting = Request(context=0, client=0, slot=0, params=ContextParams(), prompt=None, frame_limit=1,
                      budget_factor=1.0, budget_min=1)         # the pages of contexts waiting for their clients' text
    assert eng.pages.reach(waiting, 64 * 7) and eng.pages.free == 0
    eng.submit(client, [EndText(1, tuple(eng.new_tokenizer().tokenizer.encode("Now the text.")), 1.0)])
    eng.run_once()
    assert events == {1: [ContextFailed(1, "engine_full", "the speech memory is full: this context could not go on; "
                                                          "try again in a moment")]}
    assert eng.stats()["kv_full_failures"] == 1 and eng.pages.returning == 1
    eng.disconnect(client)
