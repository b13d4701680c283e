"""bench/attention_variants.py's ways compute what the engine's one-token attention computes: its one-query step (the
code predictor's in the engine) and the tensor-core kernel against the group's step, on the CPU in Triton's interpreter
(conftest.py) exactly (the tensor-core variant's products in float32 there); compiled on a GPU, within a bfloat16 step
of the output (the sums' order is the compiler's) and, for the tensor-core variant, its bfloat16 rounding of the
probabilities."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")

from bench.attention_variants import CHECKS, Case, differences  # noqa: E402

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("variant", ["lean", "dot"])
@pytest.mark.parametrize("paged,pos", CHECKS)
def test_a_variant_computes_the_engines_one_token_attention(variant, paged, pos):
    case = Case(3, pos, paged, "cuda" if CUDA else "cpu", HQ=4, HKV=2, D=32)
    for block in (16, 32) if paged else (16,):
        diff, scale, same_cache = differences(case, variant, block, 1)
        assert same_cache
        assert diff <= ((0.02 if variant == "dot" else 0.01) * scale if CUDA else 0.0), (block, diff)
