"""The Triton sampler (synth/sample_kernel.py) draws the same ids as the PyTorch sampler
(synth.sampling.sample_torch, itself tested against transformers in test_parity_talker.py).

On a CPU machine the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py); on a
GPU it runs compiled, against the PyTorch code on the same device."""
from __future__ import annotations

import importlib

import pytest
import torch

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture(scope="module")
def kernel():
    pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")
    return importlib.import_module("talkgate.synth.sample_kernel")


def rows(B: int, V: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g) * 3
    logits[:, V // 2] = logits[:, 1]                     # a tie in every row
    logits[1, 10:] = float("-inf")                       # a banned tail
    temperature = torch.rand(B, generator=g) + 0.3
    top_k = torch.randint(-1, 300, (B,), generator=g)
    top_k[:5] = torch.tensor([0, 1, V, V + 5, 2])
    top_p = torch.rand(B, generator=g)
    top_p[::3] = 1.0
    top_p[5], top_p[6] = 0.0, 0.999
    greedy = torch.rand(B, generator=g) < 0.2
    seed_ = torch.randint(0, 1 << 56, (B,), generator=g)
    counter = torch.randint(0, 1 << 33, (B,), generator=g)
    return [t.to(DEVICE) for t in (logits, temperature, top_k, top_p, greedy, seed_, counter)]


@pytest.mark.parametrize("V", [2048, 3072, 13])
def test_kernel_draws_what_the_pytorch_sampler_draws(kernel, V):
    from talkgate.synth.sampling import sample_torch
    # in the interpreter a row of the Talker's 3,072 logits (a 4,096 block) costs twice one of 2,048: there the
    # special rows (the first seven) and one more; the masked tail of a block is 13's too
    B = 256 if CUDA else 24 if V <= 2048 else 8
    for stream in (0, 1, 15):
        args = rows(B, V, seed=stream)
        got = kernel.sample(*args, stream)
        want = sample_torch(*args, stream)
        assert got.dtype == torch.int64 and got.shape == (B,)
        mismatch = (got != want).nonzero().flatten().tolist()
        # float rounding of log and of the top-p sums may flip a near-tie on the GPU: rare, never greedy
        assert len(mismatch) <= (B // 100 if CUDA else 0), (V, stream, mismatch)
        assert not args[4][mismatch].any()


def test_bfloat16_logits_draw_what_their_float32_copy_draws(kernel):
    """The code predictor hands the sampler its logits in the model dtype (no float32 copy in the codes graph)."""
    from talkgate.synth.sampling import sample
    B, V = (256, 2048) if CUDA else (16, 2048)
    for stream in (1, 15):
        args = rows(B, V, seed=stream)
        low = args[0].to(torch.bfloat16)
        assert torch.equal(kernel.sample(low, *args[1:], stream), kernel.sample(low.float(), *args[1:], stream))
        assert torch.equal(sample(low, *args[1:], stream), sample(low.float(), *args[1:], stream))


def test_a_rows_parameters_are_its_slots(kernel):
    """With slots, row b draws with the parameters at slots[b] (the engine's per-slot pools, read in the kernel): the
    ids of the same rows' parameters gathered first, in the kernel and in the PyTorch path."""
    from talkgate.synth.sampling import sample
    B, V, S = (64, 2048, 80) if CUDA else (12, 2048, 15)
    logits, *_ = rows(B, V, seed=11)
    _, *pools = rows(S, V, seed=12)                          # temperature, top_k, top_p, greedy, seed, counter of S
    counter = pools.pop()[:B]
    slots = torch.randperm(S, generator=torch.Generator().manual_seed(13))[:B].to(DEVICE)
    gathered = [t[slots] for t in pools]
    want = kernel.sample(logits, *gathered, counter, 3)
    assert torch.equal(kernel.sample(logits, *pools, counter, 3, slots), want)
    assert torch.equal(sample(logits.cpu(), *(t.cpu() for t in pools), counter.cpu(), 3, slots.cpu()),
                       sample(logits.cpu(), *(t.cpu() for t in gathered), counter.cpu(), 3))
    assert not torch.equal(kernel.sample(logits, *pools[:-1], pools[-1][:B], counter, 3), want)   # not row b's


def test_kernel_respects_top_k_and_greedy_exactly(kernel):
    V, B = 2048, 64 if CUDA else 16
    logits, temperature, _, _, _, seed, counter = rows(B, V, seed=9)
    top_k = torch.full((B,), 3, device=DEVICE)
    ids = kernel.sample(logits, temperature, top_k, torch.ones(B, device=DEVICE),
                        torch.zeros(B, dtype=torch.bool, device=DEVICE), seed, counter, 4)
    top3 = logits.topk(3, dim=-1).indices
    assert (top3 == ids[:, None]).any(-1).all()
    greedy = kernel.sample(logits, temperature, top_k, torch.ones(B, device=DEVICE),
                           torch.ones(B, dtype=torch.bool, device=DEVICE), seed, counter, 4)
    assert torch.equal(greedy, logits.argmax(-1))


@pytest.mark.parametrize("step", [2 ** -6, 0.25])
def test_kernel_keeps_ties_of_few_valued_logits(kernel, step):
    """Logits that take few distinct values (the code predictor's are bf16; coarser here: many ties at
    the k-th largest) keep exactly the PyTorch sampler's top-k survivors: each row's id is drawn from
    them, the same as the PyTorch sampler's."""
    from talkgate.synth.sampling import sample_torch
    V, B = 2048, 64 if CUDA else 12
    logits, temperature, _, _, _, seed, counter = rows(B, V, seed=5)
    logits = (logits / step).round() * step
    top_k = torch.tensor([50, 1, 2, 20, 64, 100, 127, 128, 129, 500, 2047, 50] * (B // 12 + 1), device=DEVICE)[:B]
    args = (logits, temperature, top_k, torch.ones(B, device=DEVICE), torch.zeros(B, dtype=torch.bool, device=DEVICE),
            seed, counter, 2)
    got, want = kernel.sample(*args), sample_torch(*args)
    assert (got != want).sum() <= (B // 50 if CUDA else 0)
    kth = (logits / temperature[:, None]).topk(int(top_k.max()), dim=-1).values.gather(1, top_k[:, None] - 1)
    assert ((logits / temperature[:, None]).gather(1, got[:, None]) >= kth).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codebook0_kernel_draws_and_marks_what_the_pytorch_path_does(kernel, dtype):
    """The Talker's draw in one kernel (penalty over the slot's seen ids, suppressed ids and eos banned, the draw,
    the id marked in the slot's seen row) against FrameSampler.codebook0's PyTorch code on the CPU: the same ids
    and the same seen rows; eos drawn where allowed and never marked, never drawn where not; a suppressed id never."""
    from talkgate.synth.api import SamplingParams
    from talkgate.synth.config import GenerationConfig
    from talkgate.synth.sampling import FrameSampler, RowSampling
    V, eos, S = 3072, 2150, 9
    B = 64 if CUDA else 6
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(B, V, generator=g) * 3).to(dtype)
    logits[::3, eos] = 60.0                                  # eos wins where allowed
    logits[1::3, 3000] = 90.0                                # a suppressed id would win
    # the parameters are the slots' (the engine's pools), read at each row's slot
    params = [SamplingParams(seed=100 + b, greedy=b % 4 == 1, temperature=0.5 + 0.25 * (b % 3),
                             top_k=(0, 1, 50, 3072)[b % 4], top_p=(1.0, 0.8, 0.95)[b % 3],
                             repetition_penalty=(1.0, 1.3, 0.7, 2.0)[b % 4]) for b in range(max(S, B))]
    rows = RowSampling.build(params, GenerationConfig.parse({}))
    slots = torch.randperm(S, generator=g)[:B] if B <= S else torch.arange(B)
    seen = torch.rand(max(S, B), V, generator=g) < 0.3
    seen[:, eos] = False
    suppressed = torch.zeros(V, dtype=torch.bool)
    suppressed[V - 1024:] = True
    suppressed[eos] = False
    allow_eos = torch.arange(B) % 2 == 0
    counter = torch.randint(0, 1 << 33, (B,), generator=g)

    want_seen = seen.clone()
    want = FrameSampler(rows, counter, slots).codebook0(logits, want_seen, suppressed, eos, allow_eos)
    on = [t.to(DEVICE) for t in (logits, slots, seen, suppressed, allow_eos, counter)]
    got_seen = on[2]
    got = kernel.codebook0(on[0], on[1], got_seen, on[3], eos, on[4], *(getattr(rows, name).to(DEVICE) for name in (
        "repetition_penalty", "temperature", "top_k", "top_p", "greedy", "seed")), on[5]).cpu()
    mismatch = (got != want).nonzero().flatten().tolist()
    assert len(mismatch) <= (B // 50 if CUDA else 0), mismatch         # as test_kernel_draws_what_...
    keep = [b for b in range(B) if b not in mismatch]
    assert torch.equal(got_seen.cpu()[slots[keep]], want_seen[slots[keep]])
    assert ((got == eos) == (allow_eos & (torch.arange(B) % 3 == 0))).all()
    assert not suppressed[got].any()
    assert not got_seen.cpu()[:, eos].any()
    assert got_seen.cpu()[slots[got != eos], got[got != eos]].all()
