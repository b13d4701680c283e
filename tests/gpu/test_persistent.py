"""The persistent kernels (synth/persistent.py) give what the per-layer PyTorch paths give:
- the code predictor's frame: the 15 codes of greedy and of seeded rows with the sub-talker's top-k / top-p /
  temperature, and the embedding sum, with and without small_to_mtp_projection (CodePredictor.predict);
- the Talker's step: the final-normed hidden state and the K/V written at each row's slot and position
  (Talker.forward's per-layer path).
On a CPU machine the kernels run in Triton's interpreter (one program runs every phase); on a GPU they run
compiled with one program per SM and grid barriers, against the per-layer paths on the same device."""
from __future__ import annotations

import importlib
import time
import types

import pytest
import torch

from talkgate.synth.api import SamplingParams
from talkgate.synth.config import DecoderDims, GenerationConfig, PredictorConfig
from talkgate.synth.model import CodePredictor, fuse_projections
from talkgate.synth.sampling import FrameSampler, RowSampling

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture(scope="module")
def kernel():
    pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")
    return importlib.import_module("talkgate.synth.persistent")


def predictor(talker_hidden: int, seed: int = 0, dtype=torch.float32) -> CodePredictor:
    dims = DecoderDims(hidden_size=32, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=8, rms_norm_eps=1e-6, rope_theta=10000.0)
    torch.manual_seed(seed)
    model = CodePredictor(PredictorConfig(dims=dims, vocab_size=2048, num_code_groups=16), talker_hidden)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.data = 1.0 + 0.2 * torch.randn(p.shape)
    model = model.to(DEVICE, dtype).eval().requires_grad_(False)
    fuse_projections(model)
    model.setup(DEVICE)
    return model


def sampler(B: int, top_k: int, top_p: float, temperature: float) -> FrameSampler:
    """Row 0 seeded with the given sub-talker parameters, row 1 greedy."""
    rows = RowSampling.build([SamplingParams(seed=7), SamplingParams(greedy=True)][:B], GenerationConfig.parse({}),
                             DEVICE)
    rows.sub_top_k[0], rows.sub_top_p[0], rows.sub_temperature[0] = top_k, top_p, temperature
    return FrameSampler(rows, torch.tensor([1 << 33, 5], device=DEVICE)[:B])


@pytest.mark.parametrize("talker_hidden", [32, 64])        # 64: with small_to_mtp_projection
def test_kernel_equals_the_per_step_path(kernel, talker_hidden):
    model = predictor(talker_hidden)
    for B, top_k, top_p, temperature in ((1, 50, 1.0, 0.9), (2, 0, 0.8, 1.3), (2, 7, 0.95, 0.5)):
        g = torch.Generator().manual_seed(B + top_k)
        hidden = torch.randn(B, talker_hidden, generator=g).to(DEVICE)
        code0 = torch.randn(B, talker_hidden, generator=g).to(DEVICE)
        s = sampler(B, top_k, top_p, temperature)
        assert kernel.supports(model, B)
        codes, embed_sum = kernel.predict(model, hidden, code0, s.p, s.counter, s.slots)
        # return_logits forces the per-step path on every device
        want_codes, want_sum, _ = model.predict(hidden, code0, s, return_logits=True)
        assert codes.shape == (B, 15) and codes.dtype == torch.int64
        assert torch.equal(codes, want_codes), (B, codes, want_codes)
        torch.testing.assert_close(embed_sum, want_sum, atol=1e-5, rtol=1e-5)


def test_the_models_dispatch_small_batches_only(kernel):
    model = predictor(32)
    assert kernel.supports(model, kernel.MAX_ROWS) and not kernel.supports(model, kernel.MAX_ROWS + 1)


@pytest.fixture(scope="module")
def talker(tiny_checkpoint):
    from talkgate.synth.loader import load_tts
    return load_tts(str(tiny_checkpoint), device=DEVICE, with_decoder=False).talker


# split 8: positions 17 and 39 attend in 3 and 5 parts, combined; page 8: a slot's positions in 5 pages, shuffled
@pytest.mark.parametrize("split,page", [(64, None), (8, None), (8, 8), (64, 8)])
def test_talker_step_equals_the_per_layer_path(kernel, talker, monkeypatch, split, page):
    S, L = 5, 40
    talker.setup_cache(S, L, DEVICE, torch.float32, page_len=page)
    g = torch.Generator().manual_seed(3)
    talker.kv.copy_(torch.randn(talker.kv.shape, generator=g))
    if page is not None:
        table = talker.page_table
        table.copy_(1 + torch.randperm(table.numel(), generator=g).view(table.shape).to(DEVICE))
    for B, slots, pos in ((1, [3], [17]), (2, [4, 0], [0, 39])):
        x = torch.randn(B, 1, talker.hidden_size, generator=g).to(DEVICE)
        slots, pos = torch.tensor(slots, device=DEVICE), torch.tensor(pos, device=DEVICE)
        cos, sin = talker.rope(pos[:, None])
        kv = talker.kv.clone()
        got = kernel.talker_step(talker, x[:, 0], cos[:, 0], sin[:, 0], slots, pos, split=split)
        got_kv, _ = talker.kv.clone(), talker.kv.copy_(kv)
        monkeypatch.setattr(kernel, "MAX_ROWS", 0)              # the per-layer path on every device
        want = talker(x, pos[:, None], slots)[:, 0]
        monkeypatch.undo()
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got_kv, talker.kv, atol=1e-5, rtol=1e-5)
        assert not torch.equal(got_kv, kv)                      # the step wrote its K/V


def _gate(kernel, monkeypatch, up: bool):
    """A gate to yield to (persistent.Yield) that starts `up`; its wait (on a CPU: called between the two launches) records where the first
    launch stopped (STATE, from the scratch the kernel's call made) and lowers the gate."""
    flag = torch.tensor([int(up)], dtype=torch.int32, device=DEVICE)
    stopped, made = [], []
    scratch = kernel._scratch

    def recorded(*args):                        # each kernel's call: the gate as the test set it
        flag.fill_(int(up))
        made.append(scratch(*args))
        return made[-1]
    monkeypatch.setattr(kernel, "_scratch", recorded)

    def wait(stream):
        if stream is not None:                  # on a GPU: the state is read after the call
            stream.synchronize()
        stopped.append(int(made[-1][2][0, 1]))
        flag.zero_()
    return types.SimpleNamespace(flag=flag, wait=wait), stopped


@pytest.mark.skipif(CUDA, reason="the wait is a host function here: on a GPU the gate is a stream's (test_stream_gate)")
@pytest.mark.parametrize("B", [1, 2])
def test_a_kernel_that_yields_stops_where_the_gate_was_up_and_its_second_launch_finishes(kernel, talker, monkeypatch,
                                                                                          B):
    """The gate up from the start: the Talker's first launch stops after its first layer, the code predictor's after
    its first pass, and the second launch makes the rest: the same hidden state, K/V, codes and sums as one launch;
    the gate down: the first launch does it all."""
    model = predictor(64)
    g = torch.Generator().manual_seed(11)
    hidden, code0 = (torch.randn(B, 64, generator=g).to(DEVICE) for _ in range(2))
    talker.setup_cache(5, 24, DEVICE, torch.float32)
    talker.kv.copy_(torch.randn(talker.kv.shape, generator=g))
    kv = talker.kv.clone()
    x = torch.randn(B, talker.hidden_size, generator=g).to(DEVICE)
    slots, pos = torch.tensor([1, 4][:B], device=DEVICE), torch.tensor([9, 3][:B], device=DEVICE)
    cos, sin = talker.rope(pos[:, None])

    def step():
        s = sampler(B, 50, 0.9, 1.1)
        talker.kv.copy_(kv)
        codes, sums = kernel.predict(model, hidden, code0, s.p, s.counter, s.slots)
        return codes, sums, kernel.talker_step(talker, x, cos[:, 0], sin[:, 0], slots, pos), talker.kv.clone()

    want = step()
    for up, where in ((True, [1, 1]), (False, [16, talker.cfg.dims.num_layers])):
        y, stopped = _gate(kernel, monkeypatch, up)
        with kernel.yielding(y):
            got = step()
        monkeypatch.undo()
        assert stopped == where, (up, stopped)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    assert getattr(kernel._yielding, "to", None) is None


@pytest.mark.skipif(not CUDA, reason="the gate is a CUDA stream's (synth/stream_gate.py)")
def test_a_captured_step_gives_way_to_the_gate_and_finishes_once_it_is_down(kernel, talker):
    """The engine's path: the code predictor's and the Talker's one-row kernels captured in a CUDA graph while
    yielding to the lane's gate; replayed with the gate up, the graph holds (the code predictor stopped after its
    first pass, its stream at the gate) until the gate is lowered, then gives what one launch gives."""
    from talkgate.synth.stream_gate import StreamGate
    dev = torch.device("cuda")
    gate = StreamGate.on(dev)
    assert gate is not None and gate.in_graphs
    model = predictor(64)
    g = torch.Generator().manual_seed(12)
    hidden, code0 = (torch.randn(1, 64, generator=g).to(DEVICE) for _ in range(2))
    talker.setup_cache(5, 24, DEVICE, torch.float32)
    talker.kv.copy_(torch.randn(talker.kv.shape, generator=g))
    kv = talker.kv.clone()
    x = torch.randn(1, talker.hidden_size, generator=g).to(DEVICE)
    slots, pos = torch.tensor([2], device=DEVICE), torch.tensor([7], device=DEVICE)
    cos, sin = talker.rope(pos[:, None])
    s = sampler(1, 50, 0.9, 1.1)

    def step():
        codes, sums = kernel.predict(model, hidden, code0, s.p, s.counter, s.slots)
        return codes, sums, kernel.talker_step(talker, x, cos[:, 0], sin[:, 0], slots, pos)

    want = [t.clone() for t in step()] + [talker.kv.clone()]
    main, side = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(main), kernel.yielding(gate):
        step()                                                  # the gate down: passes
        main.synchronize()
        graph.capture_begin(capture_error_mode="thread_local")
        out = step()
        graph.capture_end()
    talker.kv.copy_(kv)
    torch.cuda.synchronize()
    gate.up(side)
    side.synchronize()
    done = torch.cuda.Event()
    with torch.cuda.stream(main):
        graph.replay()
        done.record()
    time.sleep(0.2)
    assert not done.query()                                     # held at the gate
    gate.down(side)
    done.synchronize()
    for a, b in zip(list(out) + [talker.kv], want):
        assert torch.equal(a, b)


def test_tiles_split_columns_evenly():
    from talkgate.synth.persistent import tiles
    # an H100's 132 SMs: no program gets more than the even share rounded up to a chunk width
    for N, K in ((4096, 1024), (1024, 2048), (3072, 1024), (1024, 3072), (2048, 1024)):
        bn, ch, bk, p = tiles(N, K, 132, 2)
        assert bn * ch * 132 >= N and bn * ch <= 2 * -(-N // 132) and K % bk == 0 and p >= 1
