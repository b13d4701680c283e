"""The engine on a CUDA GPU: CUDA-graph steps give what eager steps give (greedy, fp32), bf16 runs clean.

Skipped on machines without a GPU (CI); run on the GPU machine: pytest tests/gpu/test_engine_gpu.py
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from talkgate.synth.api import AudioChunk, ContextDone, ContextParams, EndText, OpenContext, SamplingParams
from talkgate.synth.engine import Engine
from talkgate.synth.model import uses_persistent
from talkgate.synth.request import text_seconds
from tests.speaker import Collector, Speaker

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (not on this machine)")

TEXTS = ["Hello there, this is the first context.", "A second one, a bit different.", "Third!"]


def run_contexts(engine: Engine, params: list[ContextParams], texts: list[str]) -> list[list]:
    """Drive the engine's loop body in this thread (same batches every run): events per context."""
    events = [[] for _ in params]
    client = engine.connect(lambda batch: [events[ev.context].append(ev) for ev in batch])
    tokenizer = engine.new_tokenizer().tokenizer
    engine.submit(client, [cmd for i, (p, t) in enumerate(zip(params, texts))
                           for cmd in (OpenContext(i, p), EndText(i, tuple(tokenizer.encode(t)), text_seconds(t)))])
    for _ in range(10_000):
        if all(ev and isinstance(ev[-1], ContextDone) for ev in events):
            break
        engine.run_once()
    return events


def pcm(events) -> np.ndarray:
    return np.concatenate([e.pcm for e in events if isinstance(e, AudioChunk)])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from talkgate.synth.checkpoint import create_checkpoint
    return create_checkpoint(tmp_path_factory.mktemp("ck") / "mini", preset="mini")


PARAMS = [ContextParams(sampling=s, fixed_frames=n) for s in (SamplingParams(greedy=True), SamplingParams(seed=5))
          for n in (30, 20, 25)]


def engine_events(checkpoint, graphs: bool, compiled: bool) -> list[list]:
    engine = Engine.from_pretrained(str(checkpoint), device="cuda", dtype="float32", max_contexts=8,
                                    max_frames_per_context=64, cuda_graphs=graphs, torch_compile=compiled)
    engine.runner.warmup()
    assert bool(engine.runner.graphs) == graphs and engine.runner.compiled == compiled
    assert engine.info.decoder_dtype == "float32"          # a float32 model: no probe, the decoder as the reference
    return run_contexts(engine, PARAMS, TEXTS * 2)


@pytest.fixture(scope="module")
def eager(checkpoint):
    return engine_events(checkpoint, graphs=False, compiled=False)


def test_graphs_equal_eager(checkpoint, eager):
    """CUDA-graph steps (padded batch buckets, prefill graphs) against plain eager steps, fp32: greedy and
    seeded contexts side by side give the same codes, so the same audio up to rounding: the decoder's
    convolutions run in TF32 (cuDNN's default) with algorithms chosen per batch size (measured on the
    H100: at most 9e-4 apart; a different code would differ by ~1e-1)."""
    for ev_eager, ev_graph, p in zip(eager, engine_events(checkpoint, graphs=True, compiled=False), PARAMS):
        assert ev_graph[-1].reason == "length" and len(ev_graph) == p.fixed_frames + 1
        np.testing.assert_allclose(pcm(ev_graph), pcm(ev_eager), atol=3e-3)


def test_convolution_multiplies_follow_the_convolution_precision(monkeypatch):
    """The codec decoder's convolutions computed as a multiply (codec_decoder.conv_addmm) run at cuDNN's
    setting, as its convolutions do: TF32 by default, exact float32 when torch.backends.cudnn.allow_tf32
    is off; the matmul setting is left as it was. The third decoder block's transposed convolution at one
    frame (160 x 768 by 768 x 768; on the H100 16.8 us exact, 6.9 us TF32), unit normals: exact float32 is
    ~1e-5 off the float64 result, TF32 (10-bit mantissas) ~1e-2."""
    from talkgate.synth.codec_decoder import conv_addmm
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b, bias = (torch.randn(*shape, device="cuda", generator=g) for shape in ((160, 768), (768, 768), (768,)))
    want = (a.double() @ b.double() + bias.double()).float()
    matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert (conv_addmm(bias, a, b) - want).abs().max() < 1e-3
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert (conv_addmm(bias, a, b) - want).abs().max() > 1e-3
    assert torch.backends.cuda.matmul.allow_tf32 == matmul_tf32


def test_bf16_graphs_run_clean(checkpoint):
    engine = Engine.from_pretrained(str(checkpoint), device="cuda", dtype="bfloat16", max_contexts=20,
                                    max_frames_per_context=64, torch_compile=False)
    # a bfloat16 model's decoder runs in float16 where the load's probe allows (synth/decoder_precision.py): the
    # random weights' 44 dB on the tiny checkpoint (test_decoder_precision.py)
    assert engine.info.decoder_dtype == "float16"
    assert engine.runner.tts.codec_decoder.pre_conv.conv.weight.dtype == torch.float16
    engine.runner.warmup()
    params = [ContextParams(sampling=SamplingParams(seed=i), fixed_frames=12 + i) for i in range(17)]
    events = run_contexts(engine, params, [TEXTS[i % 3] for i in range(17)])
    for ev, p in zip(events, params):
        assert ev[-1] == ContextDone(ev[-1].context, "length", p.fixed_frames)
        audio = pcm(ev)
        assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0 and audio.std() > 0
    assert engine.stats()["free_slots"] == 20


def matching_frames(a: np.ndarray, b: np.ndarray, frames: int, atol: float) -> int:
    """How many leading 1920-sample frames of two utterances agree."""
    return next((i for i in range(frames) if not np.allclose(a[i * 1920:(i + 1) * 1920], b[i * 1920:(i + 1) * 1920],
                                                             atol=atol)), frames)


def test_compiled_graphs_follow_eager(checkpoint, monkeypatch):
    """The production path (compiled leaf functions inside the graphs), fp32 with exact convolutions. Fused kernels
    round differently, so a near-tie may flip a greedy pick late in an utterance of a random model: every context
    must run to length and most of its frames must match eager. Not in TF32: there the eager and the compiled
    decoders, each on the cuDNN algorithms its own timing search picked, drifted past 1e-3 apart after 5 to 30 frames
    from run to run (H200, 2026-12-04: 5 of 25 frames one run, 25 of 25 the next), so the count measured which
    algorithms won; exact, every frame of every context matched."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    eager = engine_events(checkpoint, graphs=False, compiled=False)
    for ev_eager, ev_fast, p in zip(eager, engine_events(checkpoint, graphs=True, compiled=True), PARAMS):
        assert ev_fast[-1].reason == "length" and len(ev_fast) == p.fixed_frames + 1, ev_fast[-1]
        same = matching_frames(pcm(ev_fast), pcm(ev_eager), p.fixed_frames, atol=1e-3)
        first = np.abs(pcm(ev_fast)[:1920] - pcm(ev_eager)[:1920]).max()
        print(f"context {p.sampling}: {same}/{p.fixed_frames} frames match eager")
        assert same >= p.fixed_frames // 2, \
            f"{p.sampling}: {same} of {p.fixed_frames} frames match eager; frame 0 apart by {first:.2e}"


def test_cuda_kernels_follow_the_cpu_path(checkpoint, eager):
    """The CUDA path's Triton kernels (one-token attention with q/k norm, RoPE and the cache write; the
    sampler) against the PyTorch code they replace, which the CPU runs: the same greedy and seeded
    contexts, fp32, give the same first frames (the seeded noise is a function of seed, frame and
    codebook, so sampled rows draw alike on both devices). Tolerance: the CUDA decoder's TF32 convolutions."""
    engine = Engine.from_pretrained(str(checkpoint), device="cpu", dtype="float32", max_contexts=8,
                                    max_frames_per_context=64)
    engine.runner.warmup()
    for ev_cpu, ev_cuda, p in zip(run_contexts(engine, PARAMS, TEXTS * 2), eager, PARAMS):
        assert ev_cpu[-1].reason == "length" and len(ev_cpu) == p.fixed_frames + 1
        same = matching_frames(pcm(ev_cuda), pcm(ev_cpu), p.fixed_frames, atol=3e-3)
        print(f"context {p.sampling}: {same}/{p.fixed_frames} frames match the CPU")
        assert same >= 5


def test_staged_capture_pads_then_captures_the_rest_between_steps(checkpoint):
    """Ready with the first-audio graphs (buckets up to 16 and the largest, every prefill graph): a batch of
    20 pads up to the largest bucket; the engine thread then captures bucket 32 while idle, and the same
    contexts run in it give the same audio (TF32 convolutions, algorithms per batch size: 3e-3)."""
    engine = Engine.from_pretrained(str(checkpoint), device="cuda", dtype="float32", max_contexts=40,
                                    max_frames_per_context=64, torch_compile=False)
    r = engine.runner
    r.warmup(first_audio_only=True)
    # pending: bucket 32 alone (every decode graph was captured after cuDNN's search: none is captured again)
    assert r.captured == [1, 2, 4, 8, 16, 40] and list(r.pending) == [("talker", 32), ("codes", 32), ("decode", 32)]
    params = [ContextParams(sampling=SamplingParams(seed=i), fixed_frames=10) for i in range(20)]
    texts = [TEXTS[i % 3] for i in range(20)]
    padded = run_contexts(engine, params, texts)
    assert r._bucket(20) == 40
    engine.start()                                      # warm already: the thread captures what is pending
    try:
        deadline = time.time() + 60
        while engine.stats()["graphs_pending"] and time.time() < deadline:
            time.sleep(0.05)
        assert engine.stats()["graphs_pending"] == 0 and r.captured == [1, 2, 4, 8, 16, 32, 40]
        assert r._bucket(20) == 32
        speaker = Speaker(engine)
        sinks = [Collector() for _ in params]
        ctxs = [speaker.open(p, sink) for p, sink in zip(params, sinks)]
        for c, t in zip(ctxs, texts):
            speaker.append(c, t)
            speaker.end(c)
        events = [sink.wait().events for sink in sinks]
    finally:
        engine.stop()
    for a, b in zip(padded, events):
        assert a[-1].reason == b[-1].reason == "length"
        np.testing.assert_allclose(pcm(b), pcm(a), atol=3e-3)


def test_opening_contexts_and_launching_a_step_never_wait_for_the_gpu(checkpoint):
    """The engine thread applies the commands of a step boundary while the step before runs: opening contexts
    (their slots' tensors set) and launching the next step queue work and never synchronize with the GPU
    (torch's sync debug mode raises on a blocking copy or a stream synchronize)."""
    engine = Engine.from_pretrained(str(checkpoint), device="cuda", dtype="float32", max_contexts=8,
                                    max_frames_per_context=64, torch_compile=False)
    engine.runner.warmup()
    client = engine.connect(lambda batch: None)
    tokenizer = engine.new_tokenizer().tokenizer
    opens = [OpenContext(i, ContextParams(sampling=SamplingParams(seed=i), fixed_frames=10)) for i in range(3)]
    engine.submit(client, [*opens, *(EndText(i, tuple(tokenizer.encode(TEXTS[i])), 1.0) for i in range(3))])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        engine._apply_commands()
        prefill, decode = engine.scheduler.schedule(time.perf_counter())
        step = engine.runner.launch(prefill, decode)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(prefill) == 3 and engine.runner.codes_of(step).shape == (3, 16)


def lane_run(checkpoint, lane: bool, opened_first: bool = False, running: int = 3,
             late_count: int = 1) -> tuple[list[list], Engine]:
    """`running` contexts run; once the first has four frames out, `late_count` more arrive while a step runs
    (Engine.poll), or with lane=False just after that step. Their voice's prompt prefix is kept already (a context of
    it ran before). opened_first: streamed text, the open comes a step before the text (opened at that step's
    boundary)."""
    engine = Engine.from_pretrained(str(checkpoint), device="cuda", dtype="float32", max_contexts=8,
                                    max_frames_per_context=64, torch_compile=False, lane=lane)
    engine.runner.warmup()
    run_contexts(engine, PARAMS[3:4], TEXTS[:1])
    events = [[] for _ in range(running + late_count)]
    client = engine.connect(lambda batch: [events[ev.context].append(ev) for ev in batch])
    tokenizer = engine.new_tokenizer().tokenizer
    said = lambda i, t, p: [OpenContext(i, p), EndText(i, tuple(tokenizer.encode(t)), text_seconds(t))]
    engine.submit(client, [cmd for i in range(running) for cmd in said(i, TEXTS[i], PARAMS[i])])
    while sum(isinstance(ev, AudioChunk) for ev in events[0]) < 4:
        engine.run_once()
    late = [cmd for j in range(late_count) for cmd in said(running + j, TEXTS[j], PARAMS[3])]
    if opened_first:
        engine.submit(client, late[:1])
        del late[:1]
        engine.run_once()
    if lane:
        def poll():
            if late:
                engine.submit(client, late[:])
                late.clear()
        engine.poll = poll
    engine.run_once()
    if late:
        engine.submit(client, late)
    for _ in range(10_000):
        if all(ev and isinstance(ev[-1], ContextDone) for ev in events):
            break
        engine.run_once()
    return events, engine


def test_a_context_arriving_during_a_step_takes_the_lane_and_speaks_as_without_it(checkpoint):
    """A new context that arrives while three contexts' step runs has its open and first frame launched on the lane
    (a stream of the highest priority, graphs and buffers of its own) beside that step, without waiting for the
    GPU; every context's audio is what it is where the new one starts at the next step boundary (to 3e-3: the batches
    differ as the new context runs a step earlier, and TF32 convolutions take algorithms per batch size)."""
    without, engine = lane_run(checkpoint, lane=False)
    assert engine.runner.lane is None and engine.stats()["lane_launches"] == 0
    with_lane, engine = lane_run(checkpoint, lane=True)
    assert engine.stats()["lane_launches"] == 1
    assert {k[1] for k in engine.runner.graphs if k[0] == "lane"} == {"open", "talker", "codes", "decode"}
    for a, b in zip(without, with_lane):
        assert a[-1].reason == b[-1].reason == "length"
        np.testing.assert_allclose(pcm(b), pcm(a), atol=3e-3)
    # launching on the lane queues work and never synchronizes with the GPU
    client = engine.connect(lambda batch: None)
    tokenizer = engine.new_tokenizer().tokenizer
    engine.submit(client, [OpenContext(9, PARAMS[3]), EndText(9, tuple(tokenizer.encode(TEXTS[0])), 1.0)])
    with engine._lock:
        (_, req, _), *_ = engine._commands
    engine._apply_commands()
    engine.scheduler.remove(req)                        # its pages given back: taken again, as _launch_lane takes them
    engine.pages.settle()
    req.frames, req.status = 0, None
    assert engine.pages.reach(req, req.next_position)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step = engine.runner.launch_lane(req)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert engine.runner.codes_of(step).shape == (1, 16)


@pytest.mark.parametrize("late_count", [1, 2])
def test_first_frames_decoded_ahead_speak_as_without_it(checkpoint, monkeypatch, late_count):
    """Past the lane's rows (here lowered to none), a step's new contexts have their first frames decoded by their own
    graph right after its codes, their slots taken out of the step's decode: every context's audio is what it is
    without that (to 3e-3, as above: batches of other sizes)."""
    import talkgate.synth.engine as engine_module
    monkeypatch.setattr(engine_module, "FIRST_APART_MAX_ROWS", 0)
    monkeypatch.setattr(engine_module, "FIRST_DECODE_MAX_ROWS", 0)
    without, engine = lane_run(checkpoint, lane=False, late_count=late_count)
    assert engine.stats()["first_decodes"] == 0
    monkeypatch.setattr(engine_module, "FIRST_DECODE_MAX_ROWS", 128)
    ahead, engine = lane_run(checkpoint, lane=False, late_count=late_count)
    assert engine.stats()["first_decodes"] == 1
    assert {k for k in engine.runner.graphs if k[0] == "first"} == {("first", 1), ("first", 2), ("first", 4)}
    for a, b in zip(without, ahead):
        assert a[-1].reason == b[-1].reason == "length"
        np.testing.assert_allclose(pcm(b), pcm(a), atol=3e-3)


def test_the_lane_runs_beside_a_one_row_step_of_the_persistent_kernels(checkpoint):
    """One context runs, so its steps are one row on the persistent kernels (cooperative grids that hold every SM);
    a second arriving during its step takes the lane beside it, and both speak as where the second waits for the
    step boundary (to 3e-3, as above)."""
    without, engine = lane_run(checkpoint, lane=False, running=1)
    assert all(uses_persistent(m, 1) for m in (engine.runner.talker, engine.runner.predictor))
    with_lane, engine = lane_run(checkpoint, lane=True, running=1)
    assert engine.stats()["lane_launches"] == 1
    for a, b in zip(without, with_lane):
        assert a[-1].reason == b[-1].reason == "length"
        np.testing.assert_allclose(pcm(b), pcm(a), atol=3e-3)


def test_a_context_opened_before_its_text_takes_the_lane_and_speaks_as_without_it(checkpoint):
    """Streamed text: the fourth context is opened at a step boundary before its text comes, and its text comes while
    a step runs: its first frame is launched on the lane without the open (its slot is set), and every context's
    audio is what it is where that text waits for the next boundary (to 3e-3, as the test above)."""
    without, engine = lane_run(checkpoint, lane=False, opened_first=True)
    assert engine.stats()["lane_launches"] == 0
    with_lane, engine = lane_run(checkpoint, lane=True, opened_first=True)
    assert engine.stats()["lane_launches"] == 1
    for a, b in zip(without, with_lane):
        assert a[-1].reason == b[-1].reason == "length"
        np.testing.assert_allclose(pcm(b), pcm(a), atol=3e-3)


def test_two_contexts_arriving_during_a_step_take_the_lane_one_behind_the_other(checkpoint):
    """Two new contexts arrive while three contexts' step runs: both are launched on the lane, the second behind the
    first on its stream (each launch a set of host buffers of its own, synth/lane.py LANE_SETS), and every context's
    audio is what it is where both start at the next step boundary (to 3e-3, as above)."""
    without, engine = lane_run(checkpoint, lane=False, late_count=2)
    with_lane, engine = lane_run(checkpoint, lane=True, late_count=2)
    assert engine.stats()["lane_launches"] == 2
    for a, b in zip(without, with_lane):
        assert a[-1].reason == b[-1].reason == "length"
        np.testing.assert_allclose(pcm(b), pcm(a), atol=3e-3)


def test_a_models_context_takes_its_lane_beside_another_models_step_in_one_thread(checkpoint):
    """`serve --colocate` (ipc/engine_group.py): two engines on one thread; while one steps a context (one row, the
    persistent kernels), the other's new context is launched on its own lane (Engine.beside_turn) and lands, and it
    speaks as it does alone on its engine (to 3e-3, as above); the running context speaks as it does alone."""
    def engine():
        e = Engine.from_pretrained(str(checkpoint), device="cuda", dtype="float32", max_contexts=8,
                                   max_frames_per_context=64, torch_compile=False, lane=True)
        e.runner.warmup()
        run_contexts(e, PARAMS[3:4], TEXTS[:1])         # its prompt prefix kept
        return e
    a, b = engine(), engine()
    alone_a, alone_b = run_contexts(a, PARAMS[:1], TEXTS[:1]), run_contexts(b, PARAMS[3:4], TEXTS[1:2])
    events = {"a": [], "b": []}
    ca = a.connect(lambda batch: events["a"].extend(batch))
    cb = b.connect(lambda batch: events["b"].extend(batch))
    tok = a.new_tokenizer().tokenizer
    said = lambda i, t, p: [OpenContext(i, p), EndText(i, tuple(tok.encode(t)), text_seconds(t))]
    a.submit(ca, said(0, TEXTS[0], PARAMS[0]))
    while sum(isinstance(ev, AudioChunk) for ev in events["a"]) < 4:
        a.run_once()
    a.beside = b.beside_turn
    b.submit(cb, said(0, TEXTS[1], PARAMS[3]))
    a.run_once()                                         # b's context launches on b's lane beside a's step
    assert b.stats()["lane_launches"] == 1
    for _ in range(10_000):
        if all(ev and isinstance(ev[-1], ContextDone) for ev in events.values()):
            break
        a.run_once()
        b.run_once()
        b.beside_turn()
    for got, alone in ((events["a"], alone_a[0]), (events["b"], alone_b[0])):
        assert got[-1].reason == alone[-1].reason == "length"
        np.testing.assert_allclose(pcm(got), pcm(alone), atol=3e-3)


def test_an_engine_loaded_after_another_in_its_process_sizes_its_slots_from_its_own_share(checkpoint):
    """`serve --colocate` loads the models of a GPU one after the other in one process, each with its share of the
    GPU's memory: what the engines loaded before it hold (their weights and slots, 6 GiB here) is not this one's,
    so each engine gets the slots of its share as the first did (on an H200 a third each gave 255, 22, 1 slots)."""
    def slots():
        e = Engine.from_pretrained(str(checkpoint), device="cuda", dtype="float32", max_frames_per_context=64,
                                   memory_share=0.08, torch_compile=False, cuda_graphs=False)
        return e, e.runner.num_slots
    first, n = slots()
    before = torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
    second, m = slots()
    assert 1 < n < 1024 and abs(m - n) <= n // 20   # without its own share: 2 slots (an H200 gave 121 and 118)
    del before, first, second


def test_a_fresh_start_compiles_in_helpers_and_leaves_warm_up_nothing_to_compile(checkpoint, tmp_path, monkeypatch,
                                                                                  caplog):
    """On an empty compile cache, load_runner's helper processes (synth/parallel_compile.py) compile every kind of
    input warm-up meets: the engine's own warm-up then compiles none (precompiled.py logs each kind it compiles),
    and marks the cache warmed so that the next start starts no helpers."""
    import logging

    from talkgate.synth import compile_cache

    monkeypatch.setenv("TALKGATE_CACHE", str(tmp_path))
    for var in compile_cache.ENV:
        monkeypatch.setitem(compile_cache.OPERATOR, var, None)
        monkeypatch.delenv(var, raising=False)
    engine = Engine.from_pretrained(str(checkpoint), device="cuda", dtype="bfloat16", max_contexts=8,
                                    max_frames_per_context=64)
    runner = engine.runner
    assert list(runner.warmed_marker.parent.rglob("*.aot")) and not runner.warmed_marker.exists()
    with caplog.at_level(logging.INFO, logger="talkgate.precompiled"):
        runner.warmup()
        assert [r.getMessage() for r in caplog.records if "loaded" in r.getMessage()]    # it sees the helpers' kinds
        assert not [r.getMessage() for r in caplog.records if "compiled and saved" in r.getMessage()]
        # the persistent kernels of two rows come from a helper that may still run: two rows take the general
        # kinds meanwhile; adopted, their graphs are captured again, and only then is the cache marked warmed
        if runner.later is not None:
            assert not runner.warmed_marker.exists() and runner.predictor.persistent_rows == 1
            runner.finish_compiles()
            assert ("codes", 2) in runner.pending
        assert runner.later is None and "persistent_rows" not in vars(runner.predictor)
        assert runner.warmed_marker.exists()
        while runner.capture_next() is not None:
            pass
        assert not [r.getMessage() for r in caplog.records if "compiled and saved" in r.getMessage()]
