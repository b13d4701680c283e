"""bench/roofline.py (issue 44): its analytic FLOP counts against torch's FlopCounterMode running the runner's own
step functions on the tiny checkpoint (so the counter cannot drift from the model), and the bench run whole on
the CPU, its table's shape checked."""
from __future__ import annotations

import json

import pytest
import torch

from bench import roofline
from talkgate.synth import roofline as counting
from talkgate.synth.runner_build import load_runner

MAX_PROMPT, MAX_FRAMES = 16, 20       # a slot of 36 positions: the CPU's Talker attends over all of them


@pytest.fixture(scope="module")
def cpu_runner(tiny_checkpoint):
    runner, *_ = load_runner(tiny_checkpoint, device="cpu", max_contexts=4, max_batch=4, max_prompt=MAX_PROMPT,
                             max_frames_per_context=MAX_FRAMES, torch_compile=False, cuda_graphs=False)
    return runner


def counted(fn) -> int:
    mode = roofline.flop_counter()
    with mode:
        fn()
    return mode.get_total_flops()


@pytest.mark.parametrize("B", [1, 3])      # one row takes the decoder's convolutions as a multiply, more cuDNN's path
def test_flops_match_flop_counter(cpu_runner, B):
    r = cpu_runner
    cfg, codec = r.tts.config, r.decoder.config
    # the last position of the slot: on the CPU the Talker's attention runs over the whole cache, so that the
    # positions it sees (0..position) are all of it, as the GPU's kernels read them
    position = MAX_PROMPT + MAX_FRAMES - 1
    with torch.inference_mode():
        r.main.inputs[0, :B] = torch.arange(B)
        r.main.inputs[1, :B] = position
        r.main.inputs[2, :B] = r.text_pad
        r.main.inputs[3, :B] = 5
        r.dec_state.pos[:B] = roofline.FRAMES          # the decoder's window full
        r.pre_in[0, 0], r.pre_in[0, 1] = 0, 8
        got = {part: counted(lambda p=part: r._parts[p](B)) for part in ("talker", "codes", "decode")}
        got["prefill"] = counted(lambda: r._prefill_step(1, 16))
    f32 = ("fp32", 4)
    assert got == {"talker": counting.talker_work(cfg, B, position, *f32).total_flops,
                   "codes": counting.code_predictor_work(cfg, B, *f32).total_flops,
                   "decode": counting.codec_decoder_work(codec, B, roofline.FRAMES, 4, "fp32", "fp32").total_flops,
                   "prefill": counting.prefill_work(cfg, 1, 16, *f32).total_flops}
    assert cfg.talker.dims.hidden_size != cfg.talker.predictor.dims.hidden_size    # the projection is counted too


def test_released_sizes_are_memory_bound_at_batch_1(tiny_checkpoint):
    """At the real 0.6B shapes a one-row step reads far more bytes than it computes FLOPs (weights dominate),
    and the code predictor's 15 passes read its layers 15 times."""
    from talkgate.synth.checkpoint import model_config
    from talkgate.synth.codec_decoder import CodecDecoderConfig
    from talkgate.synth.config import TTSConfig
    from talkgate.synth.random_speech_tokenizer import PUBLISHED_DECODER_CONFIG
    cfg = TTSConfig.parse(model_config("0.6b", "custom_voice"))
    codec = CodecDecoderConfig.from_dict({"model_type": "qwen3_tts_tokenizer_12hz",
                                          "decoder_config": PUBLISHED_DECODER_CONFIG})
    work = roofline.count_step(cfg, codec, 1, 9, 16, torch.bfloat16, torch.float32)
    talker = work["talker"]
    assert talker.weight_bytes > 0.9 * talker.bytes and talker.total_flops / talker.bytes < 2
    predictor = work["code predictor"]
    d = cfg.talker.predictor.dims
    layer_params = d.hidden_size * (d.num_heads + 2 * d.num_kv_heads) * d.head_dim + \
        d.num_heads * d.head_dim * d.hidden_size + 3 * d.hidden_size * d.intermediate_size
    assert predictor.weight_bytes > 15 * d.num_layers * layer_params * 2
    assert set(work["codec decoder"].flops) == {"fp32", "tf32"}
    assert codec.frame_samples == 1920


def test_bench_runs_on_the_cpu(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "roofline.json"
    assert roofline.main([str(tiny_checkpoint), "--device", "cpu", "--batches", "1,2", "--reps", "2",
                          "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = res["rows"]
    parts = [r["part"] for r in rows]
    # prefill once, every other part and the step at both batches, in part order
    assert parts == ["prefill"] + [p for p in roofline.PARTS[1:] + ("step (engine loop)",) for _ in (1, 2)]
    assert all(r["ms"] > 0 for r in rows)
    for r in rows:
        if r["part"] in ("host", "step (engine loop)"):
            continue
        assert r["flops"] > 0 and r["bytes"] > 0 and r["bound"] in ("memory", "compute")
        assert r["intensity"] == pytest.approx(r["flops"] / r["bytes"], abs=0.01)
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + len(rows) and all(line.count("|") == 13 for line in table)
    assert res["prompt_len"] > 0 and res["position"] == res["prompt_len"] + roofline.FRAMES
    assert res["peaks"]["of"].startswith("the H200") and res["peaks"]["bytes_per_s"] == counting.H200.bytes_per_s


def test_shares_of_peak_are_the_gpus_own():
    """An H100's bandwidth share is against its own 3.35 TB/s, not the H200's 4.8 (their FLOP peaks are the same)."""
    work = counting.Work(flops={"bf16": 1e12}, weight_bytes=5e9)
    h100, h200 = (roofline.row("talker", 256, 2.0, work, counting.gpu_peaks(name))
                  for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    assert h100["pct_flops"] == h200["pct_flops"] == pytest.approx(100 * 1e12 / 989e12 / 2e-3, abs=0.01)
    assert h100["pct_bw"] == pytest.approx(100 * 5e9 / 3.35e12 / 2e-3, abs=0.01)
    assert h200["pct_bw"] == pytest.approx(100 * 5e9 / 4.8e12 / 2e-3, abs=0.01)
    assert h100["roof_ms"] > h200["roof_ms"]
