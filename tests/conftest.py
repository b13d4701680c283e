"""Shared fixtures (kept small): random-weight checkpoints made by talkgate's own writer."""
from __future__ import annotations

import os

import pytest
import torch

# Triton kernels (synth/sample_kernel.py) run in Triton's interpreter on a machine without CUDA, so the
# CPU CI tests them too. The switch must be set before triton is first imported (its own library
# functions are decorated then); on a GPU machine nothing is interpreted.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from talkgate.synth.checkpoint import create_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A tiny custom_voice checkpoint directory (official layout, random weights, seed 0)."""
    return create_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-custom_voice", preset="tiny",
                             variant="custom_voice", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_checkpoint):
    """The tiny checkpoint's text tokenizer (the sessions tokenize; the Sans-I/O protocol tests need no engine)."""
    from talkgate.synth.tokenizer import QwenTokenizer

    return QwenTokenizer.from_dir(tiny_checkpoint)


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint):
    """One started engine on the tiny checkpoint (CPU, fp32), shared by the engine tests."""
    from talkgate.synth.engine import Engine

    engine = Engine.from_pretrained(str(tiny_checkpoint), device="cpu")
    engine.start()
    yield engine
    engine.stop()
