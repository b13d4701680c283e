"""Batched sampling with per-row parameters and per-row randomness, without host synchronization.

Every row of a batch has its own temperature, top-k, top-p, repetition penalty, greedy flag and
seed, all as tensors, so one batched step serves many contexts and can be captured in a CUDA graph
(no .item(), no data-dependent shapes, no Python branch on tensor values).

Randomness: a per-row torch.Generator cannot be used inside a captured graph, so the noise is a
pure function of (seed, counter, stream, vocabulary index) computed with a 32-bit integer hash
(Wellons' "lowbias32", in int64 arithmetic masked to 32 bits). `counter` is the frame index of the
row and `stream` the codebook (0 for the Talker, 1..15 for the code predictor), so a context with a
fixed seed draws the same numbers whatever batch it shares and whatever step it runs in. The noise
becomes Gumbel noise and the token is argmax(logits / T + g) over the top-k / top-p survivors: an
exact draw from softmax(logits / T) restricted to them (the exponential-race / Gumbel-max trick).

The processing order matches Hugging Face generate as the reference uses it: repetition penalty,
eos ban (min_new_tokens), suppressed ids, then temperature, top-k, top-p. Greedy rows take the
argmax after penalty and bans (temperature, top-k and top-p never change the argmax).
"""
from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass

import numpy as np
import torch

from talkgate.synth.api import SamplingParams
from talkgate.synth.config import GenerationConfig

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _int64(seed: int) -> int:
    """A seed of 2^63 or more (unsigned 64-bit) as the int64 of the same bits: the noise hashes the 64 bits."""
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def uniform_noise(seed: torch.Tensor, counter: torch.Tensor, stream: int, vocab: int) -> torch.Tensor:
    """[B, vocab] float32 in (0, 1): a pure function of (seed[b], counter[b], stream, index)."""
    s = _mix32(((seed >> 32) & _M32) ^ 0x9E3779B9)
    s = _mix32((seed & _M32) ^ s)
    s = _mix32(s ^ (counter & _M32))
    s = _mix32(s ^ (stream * 0x2545F491 & _M32))
    idx = _mix32(torch.arange(vocab, device=seed.device, dtype=torch.int64) + 0x632BE5AB)
    h = _mix32(s[:, None] ^ idx[None, :])
    return ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """As transformers' RepetitionPenaltyLogitsProcessor over the ids generated so far (`seen`
    [B, V] bool): a seen id's logit is multiplied by the penalty when negative, divided when not."""
    p = penalty[:, None].to(logits.dtype)
    return torch.where(seen, torch.where(logits < 0, logits * p, logits / p), logits)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           greedy: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor, stream: int,
           slots: torch.Tensor | None = None) -> torch.Tensor:
    """One id per row from logits [B, V] (already penalized and banned; any float dtype, widened to float32 where
    read, so bfloat16 logits draw what their float32 copy draws): [B] int64. The parameters are a row's [B], or with
    slots [B] a slot's [S] (row b's at slots[b]); counter is a row's.

    top_k <= 0 or >= V means no top-k filter; top_p >= 1 means no top-p filter. Ties at a
    top-k or top-p cutoff value are kept (transformers keeps top-k ties too). On CUDA one Triton
    kernel (synth/sample_kernel.py) draws the same ids as this PyTorch code (sample_torch)."""
    kernel = kernel_module("sample_kernel") if logits.is_cuda else None
    if kernel is not None:
        return kernel.sample(logits, temperature, top_k, top_p, greedy, seed, counter, stream, slots)
    if slots is not None:
        temperature, top_k, top_p, greedy, seed = (t[slots] for t in (temperature, top_k, top_p, greedy, seed))
    return sample_torch(logits.float(), temperature, top_k, top_p, greedy, seed, counter, stream)


@functools.cache
def kernel_module(name: str):
    """The Triton kernel module synth.<name>, or None where Triton is missing (then the PyTorch code runs
    everywhere). Also used by synth.model for its attention and persistent kernels."""
    try:
        return importlib.import_module(f"talkgate.synth.{name}")
    except ImportError:
        return None


def sample_torch(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 greedy: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor, stream: int) -> torch.Tensor:
    V = logits.shape[-1]
    argmax = logits.argmax(-1)
    scaled = logits / temperature[:, None].clamp_min(1e-5)
    ranked = scaled.sort(-1, descending=True).values
    k = torch.where(top_k <= 0, V, top_k).clamp(1, V)
    kth = ranked.gather(1, (k - 1)[:, None])
    ranked = ranked.masked_fill(ranked < kth, float("-inf"))
    # top-p: keep the shortest prefix of the ranked ids whose mass before it is below top_p
    probs = ranked.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    keep = (mass_before < top_p[:, None]).sum(-1).clamp_min(1)
    cutoff = torch.maximum(ranked.gather(1, (keep - 1)[:, None]), kth)
    scaled = scaled.masked_fill(scaled < cutoff, float("-inf"))
    u = uniform_noise(seed, counter, stream, V)
    drawn = (scaled - torch.log(-torch.log(u))).argmax(-1)
    return torch.where(greedy, argmax, drawn)


@dataclass
class RowSampling:
    """Per-row sampling parameters, one tensor [B] each (the engine keeps one per slot, which the draws read at each
    row's slot: FrameSampler).

    Talker (codebook 0): temperature, top_k, top_p, repetition_penalty, greedy.
    Code predictor (codebooks 1..15, "sub-talker"): sub_temperature, sub_top_k, sub_top_p, sub_greedy
    (no repetition penalty, as in the reference). seed: int64 per row."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    repetition_penalty: torch.Tensor
    greedy: torch.Tensor
    sub_temperature: torch.Tensor
    sub_top_k: torch.Tensor
    sub_top_p: torch.Tensor
    sub_greedy: torch.Tensor
    seed: torch.Tensor

    def copy_rows_(self, rows: torch.Tensor, ints: torch.Tensor, floats: torch.Tensor) -> None:
        """self[rows] = the rows that host_values made (ints [len(INT_FIELDS), n], floats [len(FLOAT_FIELDS), n],
        on this device): how the engine fills a new context's slot, from one copy of each block."""
        for block, names in ((ints, INT_FIELDS), (floats, FLOAT_FIELDS)):
            for values, name in zip(block, names):
                pool = getattr(self, name)
                pool.index_copy_(0, rows, values if values.dtype == pool.dtype else values.to(pool.dtype))

    @staticmethod
    def host_values(params: list[SamplingParams], gen: GenerationConfig, ints: np.ndarray, floats: np.ndarray) -> None:
        """Resolve SamplingParams against generation_config.json (None -> its value) into ints[:, i] (INT_FIELDS)
        and floats[:, i] (FLOAT_FIELDS) for params[i].

        The request's temperature / top_k / top_p / repetition_penalty apply to codebook 0; the code
        predictor keeps generation_config's subtalker_* values. greedy (or do_sample false) makes
        codebook 0 greedy; greedy (or subtalker_dosample false) makes codebooks 1..15 greedy.
        seed: a signed or unsigned 64-bit integer (the engine refuses others); None draws a fresh random one."""
        def pick(v, default):
            return default if v is None else v

        for i, p in enumerate(params):
            ints[:, i] = (int(pick(p.top_k, gen.top_k)), bool(p.greedy or not gen.do_sample), int(gen.subtalker_top_k),
                          bool(p.greedy or not gen.subtalker_dosample),
                          _int64(p.seed) if p.seed is not None else int.from_bytes(os.urandom(7), "little"))
            floats[:, i] = (float(pick(p.temperature, gen.temperature)), float(pick(p.top_p, gen.top_p)),
                            float(pick(p.repetition_penalty, gen.repetition_penalty)),
                            float(gen.subtalker_temperature), float(gen.subtalker_top_p))

    @classmethod
    def build(cls, params: list[SamplingParams], gen: GenerationConfig,
              device: torch.device | str = "cpu") -> "RowSampling":
        """The rows of `params` (host_values' rules) as tensors on `device`."""
        ints, floats = np.zeros((len(INT_FIELDS), len(params)), np.int64), np.zeros((len(FLOAT_FIELDS), len(params)),
                                                                                   np.float32)
        cls.host_values(params, gen, ints, floats)
        rows = {name: torch.from_numpy(values) for block, names in ((ints, INT_FIELDS), (floats, FLOAT_FIELDS))
                for values, name in zip(block, names)}
        for name in ("greedy", "sub_greedy"):
            rows[name] = rows[name].bool()
        return cls(**{name: t.to(device) for name, t in rows.items()})


# the fields of RowSampling in host_values' two blocks (greedy flags as 0 / 1)
INT_FIELDS = ("top_k", "greedy", "sub_top_k", "sub_greedy", "seed")
FLOAT_FIELDS = ("temperature", "top_p", "repetition_penalty", "sub_temperature", "sub_top_p")


class FrameSampler:
    """Samples the 16 codes of one frame for a batch: built per step from the caller's per-slot RowSampling (`rows`,
    the engine's pools), the rows' frame indices (`counter` [B]) and their slots (`slots` [B]; None: row b is slot b,
    rows a batch's own), used by synth.model.sample_codes. The draws read a row's parameters at its slot."""

    def __init__(self, rows: RowSampling, counter: torch.Tensor, slots: torch.Tensor | None = None):
        self.p, self.counter = rows, counter
        self.slots = torch.arange(len(counter), device=counter.device) if slots is None else slots

    def codebook0(self, logits: torch.Tensor, seen: torch.Tensor, suppressed: torch.Tensor, eos: int,
                  allow_eos: torch.Tensor) -> torch.Tensor:
        """Codebook 0 from the Talker's logits [B, 3072] (any float dtype, drawn as their float32 copy): seen [S, 3072]
        bool, the ids each slot's context drew so far (a row reads its slot's; its drawn id is marked there unless
        it is eos); the suppressed control ids [3072] bool, and eos, banned where allow_eos [B] bool is False."""
        p = self.p
        kernel = kernel_module("sample_kernel") if logits.is_cuda else None
        if kernel is not None:      # one kernel for all of it (the PyTorch code below is about 15 in a CUDA graph)
            return kernel.codebook0(logits, self.slots, seen, suppressed, eos, allow_eos, p.repetition_penalty,
                                    p.temperature, p.top_k, p.top_p, p.greedy, p.seed, self.counter)
        logits = apply_repetition_penalty(logits.float(), seen[self.slots], p.repetition_penalty[self.slots])
        is_eos = torch.arange(logits.shape[-1], device=logits.device) == eos
        logits = logits.masked_fill(suppressed | (is_eos & ~allow_eos[:, None]), float("-inf"))
        code = sample(logits, p.temperature, p.top_k, p.top_p, p.greedy, p.seed, self.counter, 0, self.slots)
        # marked unless eos, as the kernel's masked store: a sync-free write of the old value there
        seen.index_put_((self.slots, code), seen[self.slots, code] | (code != eos))
        return code

    def acoustic(self, logits: torch.Tensor, group: int) -> torch.Tensor:
        """Codebook `group` (1..15) from the code predictor's logits [B, 2048] (its model dtype)."""
        p = self.p
        return sample(logits, p.sub_temperature, p.sub_top_k, p.sub_top_p, p.sub_greedy, p.seed, self.counter, group,
                      self.slots)
