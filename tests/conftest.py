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

# The session's leak check: the run fails when a test leaves a thread, a child process or a socket
# behind (tests/leakcheck.py says what it counts and what it leaves out).
pytest_plugins = ("tests.leakcheck",)


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


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices gain nothing from threads; on a busy 2-core machine OpenMP's waiting makes them slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_base_checkpoint(tmp_path_factory):
    """A tiny Base checkpoint (voice cloning: speaker encoder, codec encoder), random weights, seed 0."""
    return create_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-base", preset="tiny", variant="base", seed=0)


@pytest.fixture(scope="session")
def base_server(tiny_base_checkpoint, tmp_path_factory):
    """`talkgate serve` of the tiny Base checkpoint with an API key (tests/voicetools.py KEY), a voice store of
    its own (`.store`) and --seed 1, shared by the voice tests (HTTP, client libraries, the web page)."""
    from tests.serverproc import TalkgateServer
    from tests.voicetools import KEY

    store = tmp_path_factory.mktemp("voice-store")
    with TalkgateServer(tiny_base_checkpoint, "--api-key", KEY, "--voice-store", str(store), "--seed",
                        "1") as srv:
        srv.store = store
        yield srv


KINDS = ("unit", "system", "parity", "gpu")       # tests/<kind>/: pyproject.toml registers each as a marker


def pytest_collection_modifyitems(items):
    """Each test is marked with its folder's kind (`pytest -m "not system"`, say)."""
    for item in items:
        kind = next((part for part in item.path.parts[-3:-1] if part in KINDS), None)
        if kind is not None:
            item.add_marker(kind)
