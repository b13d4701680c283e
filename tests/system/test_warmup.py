"""Cold start without a GPU: the compile cache's folder, the staged capture's choices, compiled functions bound
per model. (The compiles and captures themselves run on the GPU machine: bench/gpu_coldstart.sh.)"""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from talkgate.cli.main import main
from talkgate.synth import compile_cache
from talkgate.synth.api import ContextParams
from talkgate.synth.engine import capture_slack, unnoticed
from talkgate.synth.precompiled import PrecompiledFunction
from talkgate.synth.request import Request
from talkgate.synth.runner import (PLAIN_WHEN_PRIMING, _compiled_graphs, batch_buckets, compile_hot_functions,
                                   fit_bucket, plain_functions)
from talkgate.synth.scheduler import Scheduler

GPU = {"name": "NVIDIA H100 80GB HBM3", "capability": "90", "sms": 132}
VERSIONS = {"torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91300, "python": "3.12.3", "triton": "3.6.0"}
SHAPE = {"talker": {"hidden_size": 2048, "num_hidden_layers": 28}, "speech_tokenizer": {"x": 1},
         "dtype": "torch.bfloat16", "decoder_dtype": "torch.float32"}


def test_cache_key_names_gpu_versions_and_shape():
    key = compile_cache.cache_key(GPU, VERSIONS, SHAPE)
    assert key == compile_cache.cache_key(dict(GPU), dict(VERSIONS), json.loads(json.dumps(SHAPE)))
    assert key.startswith("nvidia-h100-80gb-hbm3-sm90-torch2.11.0+cu130-") and "/" not in key
    others = [compile_cache.cache_key({**GPU, "name": "NVIDIA H200"}, VERSIONS, SHAPE),
              compile_cache.cache_key({**GPU, "capability": "89"}, VERSIONS, SHAPE),
              compile_cache.cache_key(GPU, {**VERSIONS, "triton": "3.5.0"}, SHAPE),
              compile_cache.cache_key(GPU, {**VERSIONS, "cudnn": 91200}, SHAPE),
              compile_cache.cache_key(GPU, VERSIONS, {**SHAPE, "talker": {"hidden_size": 1024}}),
              compile_cache.cache_key(GPU, VERSIONS, {**SHAPE, "dtype": "torch.float16"})]
    assert len({key, *others}) == 7


def test_the_three_variants_of_one_size_share_a_compile_cache(tiny_checkpoint, tiny_base_checkpoint, tmp_path):
    """CustomVoice differs from Base and VoiceDesign only by its speaker tables (prompt tokens): one compile folder,
    so that their engine processes on one GPU share one set of compile helpers; another size does not."""
    from talkgate.synth.checkpoint import create_checkpoint
    from talkgate.synth.config import TTSConfig

    design = create_checkpoint(tmp_path / "vd", preset="tiny", variant="voice_design", seed=0)
    mini = create_checkpoint(tmp_path / "mini", preset="mini", variant="base", seed=0)
    def shape(root):
        config = TTSConfig.parse(json.loads((root / "config.json").read_text()))
        return compile_cache.shape_of(config, root, torch.bfloat16, torch.float32)
    cv, base, vd = shape(tiny_checkpoint), shape(tiny_base_checkpoint), shape(design)
    assert cv == base == vd and "spk_id" not in cv["talker"]
    assert shape(mini) != cv
    assert compile_cache.shape_of(TTSConfig.parse(json.loads((tiny_checkpoint / "config.json").read_text())),
                                  tiny_checkpoint, torch.bfloat16, torch.float16) != cv


def test_cache_folder_under_the_talkgate_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TALKGATE_CACHE", str(tmp_path))
    for var in compile_cache.ENV:
        monkeypatch.delenv(var, raising=False)             # restored after the test
    monkeypatch.setattr(compile_cache, "OPERATOR", {var: None for var in compile_cache.ENV})
    folder = compile_cache.use("k1", {"gpu": GPU})
    assert folder == tmp_path / "compile" / "k1" and json.loads((folder / "key.json").read_text()) == {"gpu": GPU}
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(folder / "triton")
    compile_cache.use("k2")                                 # another model in the same process moves them
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "compile" / "k2" / "triton")
    # an operator's own setting wins
    monkeypatch.setattr(compile_cache, "OPERATOR", {"TORCHINDUCTOR_CACHE_DIR": "/srv/inductor", "TRITON_CACHE_DIR": None})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/srv/inductor")
    compile_cache.use("k3")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/srv/inductor"
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "compile" / "k3" / "triton")


def test_a_batch_runs_in_the_smallest_captured_bucket():
    assert batch_buckets(256)[:6] == [1, 2, 4, 8, 16, 32] and batch_buckets(256)[-1] == 256
    first = [1, 2, 4, 8, 16, 256]                          # captured before ready
    assert [fit_bucket(first, n) for n in (1, 3, 8, 9, 16, 17, 200, 256)] == [1, 4, 8, 16, 16, 256, 256, 256]
    later = sorted(first + [32, 48])                       # after two background captures
    assert [fit_bucket(later, n) for n in (17, 33, 49)] == [32, 48, 256]


def req(context: int, frames: int, t_ready: float | None, tokens: int = 1, ended: bool = False) -> Request:
    r = Request(context=context, client=1, slot=context, params=ContextParams(), prompt=None,
                frame_limit=750, budget_factor=4.0, budget_min=50)
    r.text_ids, r.frames, r.t_ready, r.text_ended = list(range(tokens)), frames, t_ready, ended
    return r


def test_captures_wait_until_no_context_would_notice():
    s = Scheduler(max_batch=8, max_prefills=4)
    assert unnoticed(s, now=10.0)                          # idle
    ahead = req(1, frames=20, t_ready=9.0, tokens=30)      # 1.6 s of audio, 1 s played: 0.6 s ahead
    s.running.append(ahead)
    assert unnoticed(s, now=10.0) and not unnoticed(s, now=10.2)
    assert not unnoticed(s, now=10.0, slack=capture_slack(1.2))          # a 1.2-s capture would be heard
    assert capture_slack(0.02) == 0.5 and capture_slack(1.2) == pytest.approx(1.8)
    starved = req(2, frames=3, t_ready=0.0, tokens=3)      # its next token has not come: it cannot run
    s.running.append(starved)
    assert unnoticed(s, now=10.0)
    s.waiting.append(req(3, frames=0, t_ready=None, tokens=0))         # opened, no text yet
    assert unnoticed(s, now=10.0)
    s.waiting.append(req(4, frames=0, t_ready=None, tokens=1))         # ready for its first frame
    assert not unnoticed(s, now=10.0)


def test_compiled_functions_are_bound_to_the_model_not_its_classes(tiny_checkpoint, tmp_path):
    from talkgate.synth import codec_decoder, model
    from talkgate.synth.loader import load_tts
    plain = {(cls, name): getattr(cls, name) for cls, name in ((model.RMSNorm, "forward"), (model.Attention, "qkv"),
                                                             (codec_decoder.CodecDecoder, "late_convs"))}
    tts, other = load_tts(tiny_checkpoint), load_tts(tiny_checkpoint)
    n = compile_hot_functions(tts.talker, tts.code_predictor, tts.codec_decoder, folder=tmp_path)
    assert n > 10 and compile_hot_functions(tts.talker, folder=tmp_path) == 0          # idempotent
    for (cls, name), fn in plain.items():
        assert getattr(cls, name) is fn                                        # classes untouched
    norm = tts.talker.layers[0].input_layernorm
    assert "forward" in vars(norm) and vars(norm)["forward"].__self__ is norm
    assert "forward" not in vars(other.talker.layers[0].input_layernorm)    # another model: plain
    assert "late_convs" in vars(tts.codec_decoder) and "late_convs" not in vars(other.codec_decoder)
    assert "convs" not in vars(tts.codec_decoder)             # plain: it calls the two compiled halves
    # one compiled function per method, shared by every instance
    assert vars(norm)["forward"].__func__ is vars(tts.talker.layers[1].input_layernorm)["forward"].__func__
    # priming a voice runs the plain decoder functions, and cuDNN's heuristics; both come back after
    compiled, search = vars(tts.codec_decoder)["late_convs"], torch.backends.cudnn.benchmark
    with plain_functions(tts.codec_decoder, PLAIN_WHEN_PRIMING):
        assert not {"codes_in", "early_convs", "late_convs"} & set(vars(tts.codec_decoder))
        assert not torch.backends.cudnn.benchmark
    assert vars(tts.codec_decoder)["late_convs"] is compiled and torch.backends.cudnn.benchmark == search


KINDS_SCRIPT = """
import logging, sys, torch
from talkgate.synth import codec_decoder, precompiled
from talkgate.synth.runner import _compiled_graphs
precompiled.enable()
residual = precompiled.PrecompiledFunction(codec_decoder.RMSNorm.residual, sys.argv[1])
norm = codec_decoder.RMSNorm(8, 1e-5)
torch.manual_seed(0)
with torch.inference_mode():
    for shape in ((5, 2, 8), (1, 2, 8), (4, 3, 8), (7, 2, 8)):
        x, delta = torch.randn(shape), torch.randn(shape)
        out, normed = residual(norm, x, norm.weight, delta)
        assert torch.allclose(out, x + delta) and torch.allclose(normed, norm(x + delta), atol=1e-5)
print(len(residual.kinds), residual.compiled, _compiled_graphs())
"""


def test_compiled_kinds_are_kept_and_the_next_process_loads_them_without_tracing(tmp_path, caplog):
    """One kind for every batch of 2 or more, one for a single row, one for another static size; each saved
    once; a new process loads all three and traces nothing (Dynamo's count of graphs stays 0)."""
    import subprocess
    import sys
    import time

    from talkgate.synth import codec_decoder, precompiled
    precompiled.enable()
    folder = tmp_path / "residual"
    norms = [codec_decoder.RMSNorm(8, 1e-5) for _ in range(2)]
    residual = PrecompiledFunction(codec_decoder.RMSNorm.residual, folder)
    call = residual.function()                                                  # what compile_hot_functions binds
    with torch.inference_mode():
        for b, norm in ((5, norms[0]), (3, norms[1]), (2, norms[0]), (8, norms[1])):
            x, delta = torch.randn(b, 2, 8), torch.randn(b, 2, 8)
            out, normed = call(norm, x, norm.weight, delta)                    # a parameter: never marked
            assert torch.allclose(out, x + delta) and normed.shape == (b, 2, 8)
        assert residual.compiled == 1 and len(list(folder.glob("*.aot"))) == 1
        call(norms[0], torch.randn(1, 2, 8), norms[0].weight, torch.randn(1, 2, 8))
        assert residual.compiled == 2                                          # size 1 stays a kind of its own
        call(norms[0], torch.randn(4, 3, 8), norms[0].weight, torch.randn(4, 3, 8))
        assert residual.compiled == 3 and len(list(folder.glob("*.aot"))) == 3  # the other sizes were static
    run = subprocess.run([sys.executable, "-c", KINDS_SCRIPT, str(folder)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["3", "0", "0"]                     # 3 kinds loaded, none compiled, nothing traced
    (folder / "0000.aot").write_bytes(b"not an artifact")                       # cut short, or another torch's
    for name, age in (("old.tmp", precompiled.STALE_WRITE_S + 60), ("new.tmp", 0)):   # partial writes
        (folder / name).write_bytes(b"")
        os.utime(folder / name, (time.time() - age,) * 2)
    again = PrecompiledFunction(codec_decoder.RMSNorm.residual, folder)
    with torch.inference_mode():
        again(norms[0], torch.randn(3, 2, 8), norms[0].weight, torch.randn(3, 2, 8))
    assert len(again.kinds) == 3 and again.compiled == 0 and "0000.aot: not loaded" in caplog.text
    assert not (folder / "old.tmp").exists() and (folder / "new.tmp").exists()       # another process's, maybe


def test_warmup_command_on_cpu_has_nothing_to_do(tiny_checkpoint, capsys):
    assert main(["warmup", "--model", str(tiny_checkpoint), "--device", "cpu", "--max-contexts", "2"]) == 0
    assert "nothing is compiled or captured" in capsys.readouterr().out


def test_warmup_command_warms_every_model_of_a_models_file(tiny_checkpoint, tmp_path, capsys):
    """`warmup --models FILE` reads serve's models file: each model loaded in turn with its own max_contexts (else
    --max-contexts); the file's mistakes, a path that is not there, and --model beside it stop it before any load."""
    path = tmp_path / "models.jsonl"
    path.write_text(f'# two of one checkpoint\n{{"name": "cv", "path": "{tiny_checkpoint}", "max_contexts": 3}}\n'
                    f'{{"name": "other", "path": "{tiny_checkpoint}"}}\n')
    assert main(["warmup", "--models", str(path), "--device", "cpu", "--max-contexts", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("talkgate: cv (3 slots) on cpu: nothing is compiled"), out
    assert out[1].startswith("talkgate: other (2 slots) on cpu: nothing is compiled"), out
    for text, expected in ((f'{{"path": "{tiny_checkpoint}", "memory": 1}}', "line 1: unknown key 'memory'"),
                           (f'{{"path": "{tiny_checkpoint}"}}\n{{"path": "{tmp_path}/none"}}', f"{tmp_path}/none")):
        path.write_text(text)
        assert main(["warmup", "--models", str(path), "--device", "cpu"]) == 2
        captured = capsys.readouterr()
        assert expected in captured.err and captured.out == "", captured
    assert main(["warmup", "--models", str(path), "--model", str(tiny_checkpoint), "--device", "cpu"]) == 2
    assert "--model and --models: give the models in one place" in capsys.readouterr().err


def test_warmup_command_warms_every_model_given(tiny_checkpoint, capsys, monkeypatch):
    """Several --model as serve takes them ([NAME=]DIR): each is loaded and warmed in turn (stand-in GPU engines:
    what warmup calls of one)."""
    from talkgate.synth.engine import Engine
    warmed = []

    class StandInRunner:
        device, num_slots, graphs = torch.device("cuda"), 2, ()

        def __init__(self, checkpoint):
            self.checkpoint = checkpoint

        def warmup(self):
            warmed.append(self.checkpoint)

        def finish_compiles(self):
            pass

    def from_pretrained(checkpoint, **kwargs):
        return SimpleNamespace(runner=StandInRunner(checkpoint), info=SimpleNamespace(name=checkpoint, size="tiny"))
    monkeypatch.setattr(Engine, "from_pretrained", from_pretrained)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    assert main(["warmup", "--model", f"cv={tiny_checkpoint}", "--model", str(tiny_checkpoint), "--max-contexts",
                 "2"]) == 0
    assert warmed == [str(tiny_checkpoint)] * 2
    out = capsys.readouterr().out
    assert f"warm-up of cv ({tiny_checkpoint}" in out and f"warm-up of tiny-custom_voice ({tiny_checkpoint}" in out


def test_warmup_command_takes_serves_model_flags(capsys):
    with pytest.raises(SystemExit):
        main(["warmup", "--help"])
    out = capsys.readouterr().out
    assert all(flag in out for flag in ("--model", "--models", "--device", "--dtype", "--max-contexts"))


def test_artifacts_are_kept_per_version_of_the_model_code_and_only_the_last_few(tmp_path):
    import time

    from talkgate.synth import precompiled
    old = [tmp_path / f"old{i}" for i in range(precompiled.KEEP_VERSIONS + 1)]
    for i, folder in enumerate(old):
        folder.mkdir()
        (folder / "x.aot").write_bytes(b"")
        os.utime(folder, (time.time() - 1000 + i, time.time() - 1000 + i))     # old0 used longest ago
    folder = precompiled.code_folder(tmp_path)
    assert folder.name == precompiled.code_digest() and folder.is_dir()
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted([folder.name] + [p.name for p in old[-(precompiled.KEEP_VERSIONS - 1):]])
    assert precompiled.code_folder(tmp_path) == folder and folder.is_dir()              # the same code: the same
