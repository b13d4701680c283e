"""synth/row_copy.py's kernel writes what index_copy_ writes: directly into a column span of a pool, and as the codec
decoder's state write-back through decode steps. In Triton's interpreter on a CPU machine (conftest.py), compiled on
a GPU."""
from __future__ import annotations

import importlib

import pytest
import torch

from talkgate.synth import codec_decoder
from talkgate.synth.codec_decoder import load_codec_decoder
from talkgate.synth.random_speech_tokenizer import write_random_codec_decoder
from tests.unit.test_codec_decoder import TINY

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def kernel():
    pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")
    return importlib.import_module("talkgate.synth.row_copy")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [1, 37, 2 * 2048 + 5])              # one value, less than a block, over two blocks
def test_rows_land_where_index_copy_puts_them(kernel, dtype, n):
    torch.manual_seed(0)
    pool = torch.randn(7, n + 11, device=DEVICE).to(dtype)
    rows = torch.tensor([5, 0, 3], device=DEVICE)
    src = torch.randn(3, n, device=DEVICE).to(dtype)
    want = pool.clone()
    want[:, 8:8 + n].index_copy_(0, rows, src)
    got = pool.clone()
    kernel.copy_rows(got[:, 8:8 + n], rows, src)
    assert torch.equal(got, want)


def test_no_rows_and_no_columns_write_nothing(kernel):
    pool = torch.randn(4, 6, device=DEVICE)
    got = pool.clone()
    kernel.copy_rows(got[:, :0], torch.tensor([1, 2], device=DEVICE), torch.empty(2, 0, device=DEVICE))
    kernel.copy_rows(got, torch.empty(0, dtype=torch.long, device=DEVICE), torch.empty(0, 6, device=DEVICE))
    assert torch.equal(got, pool)


def test_decode_steps_write_the_state_index_copy_writes(kernel, tmp_path, monkeypatch):
    """Frame by frame, two rows in slots 3 and 1 of five: the kernel's write-back leaves the PyTorch path's state
    and PCM."""
    model = load_codec_decoder(write_random_codec_decoder(tmp_path, TINY, seed=1), DEVICE)
    monkeypatch.setattr(codec_decoder, "KERNEL_ON_CPU", True)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    frames, slots = 6, torch.tensor([3, 1], device=DEVICE)
    codes = torch.randint(0, TINY["codebook_size"], (2, 16, frames), generator=torch.Generator().manual_seed(3))
    codes = codes.to(DEVICE)
    row_kernel = model.row_kernel
    calls = []

    def counted(*args):
        calls.append(args)
        return row_kernel(*args)

    runs = []
    for path_kernel in (counted, None):                          # the kernel's write-back, then index_copy_
        monkeypatch.setattr(model, "row_kernel", path_kernel)
        state = model.alloc_state(5)
        pcm = torch.cat([model.decode_step(codes[..., i:i + 1], slots, state) for i in range(frames)], dim=1)
        runs.append((pcm, state))
    (got, got_state), (want, want_state) = runs
    assert len(calls) == frames * len(model.tail_spans)
    assert torch.equal(got, want)
    assert torch.equal(got_state.tails, want_state.tails) and got_state.tails[[3, 1]].any()
    assert not got_state.tails[[0, 2, 4]].any()
