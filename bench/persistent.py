"""The persistent kernels alone (synth/persistent.py) at the published sizes, timed in CUDA graphs: the Talker's
frame step and the code predictor's frame, 1 and 2 rows, early and late in the utterance; each against the
per-layer path (Talker hidden state, the predictor's codes) and, with --variant, against other versions of
synth/persistent.py on the same weights (A/B in one process).

    python -m bench.persistent --sizes 0.6b,1.7b [--variant base=/tmp/persistent_base.py] [--json out.json]

Random weights at real shapes (no checkpoint on disk); bf16 as the engine runs them; the predictor samples with
the checkpoint's sub-talker defaults (top-k 50, temperature 0.9) on row 0, greedy on row 1.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics

import torch

from talkgate.synth import persistent
from talkgate.synth.api import SamplingParams
from talkgate.synth.checkpoint import GENERATION_CONFIG, model_config
from talkgate.synth.config import GenerationConfig, TalkerConfig
from talkgate.synth.model import CodePredictor, Talker, fuse_projections
from talkgate.synth.sampling import FrameSampler, RowSampling

DEV, DT = "cuda", torch.bfloat16
SLOT_LEN = 878                   # 128 prompt positions + 750 frames, as the engine's slots


def build(size: str):
    cfg = TalkerConfig.parse(model_config(size, "custom_voice")["talker_config"])
    torch.manual_seed(0)
    with torch.device(DEV):
        talker, predictor = Talker(cfg), CodePredictor(cfg.predictor, cfg.dims.hidden_size)
    for model in (talker, predictor):
        for name, p in model.named_parameters():
            p.data = (1.0 + 0.1 * torch.randn_like(p) if p.dim() == 1 else 0.02 * torch.randn_like(p)).to(DT)
        model.eval().requires_grad_(False)
    fuse_projections(talker, predictor)
    predictor.setup(DEV)
    talker.setup_cache(4, SLOT_LEN, DEV, DT)
    talker.kv.normal_()
    return talker, predictor


def graph_ms(fn, reps: int = 200, rounds: int = 5, calls: int = 1) -> float:
    """Median over rounds of the mean ms of one call of fn, `calls` calls captured back to back in a CUDA graph (more
    than one: a short kernel's time without a replay's launch between calls)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        start.record()
        for _ in range(reps):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps / calls)
    return round(statistics.median(times), 4)


def kernel_report(module) -> dict:
    """Registers and spills of each compiled persistent kernel of a module (Triton's JIT cache)."""
    out = {}
    for name in ("talker_kernel", "predictor_kernel"):
        try:
            cache = getattr(module, name).device_caches[torch.cuda.current_device()][0]
            out[name] = [{"regs": k.n_regs, "spills": k.n_spills} for k in cache.values()]
        except Exception as e:                       # the cache layout is Triton's, not ours
            out[name] = repr(e)
    return out


def load_variant(path: str):
    spec = importlib.util.spec_from_file_location(f"variant_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sampler(B: int) -> FrameSampler:
    rows = RowSampling.build([SamplingParams(seed=7), SamplingParams(greedy=True)][:B],
                             GenerationConfig.parse(GENERATION_CONFIG), DEV)
    return FrameSampler(rows, torch.tensor([1 << 33, 5], device=DEV)[:B])


def run_size(size: str, variants: dict, batches: list[int]) -> dict:
    talker, predictor = build(size)
    H = talker.hidden_size
    res = {}
    for B in batches:
        if not persistent.supports(talker, B) and not persistent.supports(predictor, B):
            continue
        g = torch.Generator(device=DEV).manual_seed(B)
        x = torch.randn(B, H, device=DEV, generator=g).to(DT)
        slots = torch.arange(B, device=DEV) + 1
        hidden, code0 = torch.randn(B, H, device=DEV, generator=g).to(DT), torch.randn(B, H, device=DEV, generator=g).to(DT)
        s = sampler(B)
        want_codes, _, _ = predictor.predict(hidden, code0, s, return_logits=True)      # the per-step path
        for late in (40, 600):
            pos = torch.full((B,), late, device=DEV)
            cos, sin = talker.rope(pos[:, None])
            cos, sin = cos[:, 0].contiguous(), sin[:, 0].contiguous()
            kv = talker.kv.clone()
            if persistent.supports(talker, B):
                saved, persistent.MAX_ROWS = persistent.MAX_ROWS, 0
                want = talker(x[:, None], pos[:, None], slots)[:, 0].float()           # the per-layer path
                persistent.MAX_ROWS = saved
                talker.kv.copy_(kv)
            for name, mod in variants.items():
                row = res.setdefault(f"B{B}", {}).setdefault(name, {})
                if persistent.supports(talker, B):
                    got = mod.talker_step(talker, x, cos, sin, slots, pos).float()
                    talker.kv.copy_(kv)
                    row[f"talker_err_pos{late}"] = round(float((got - want).abs().max() / want.abs().max()), 5)
                    row[f"talker_ms_pos{late}"] = graph_ms(lambda: mod.talker_step(talker, x, cos, sin, slots, pos))
                    talker.kv.copy_(kv)
                if late == 40 and persistent.supports(predictor, B):
                    codes, _ = mod.predict(predictor, hidden, code0, s.p, s.counter)
                    row["codes_equal_per_step_path"] = bool(torch.equal(codes, want_codes))
                    row["predictor_ms"] = graph_ms(lambda: mod.predict(predictor, hidden, code0, s.p, s.counter))
                print(size, f"B={B}", name, row, flush=True)
    res["kernels"] = {name: kernel_report(mod) for name, mod in variants.items()}
    return res


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="0.6b")
    p.add_argument("--variant", action="append", default=[], help="name=path of another synth/persistent.py")
    p.add_argument("--batches", default="1,2")
    p.add_argument("--only", help="time only this variant (e.g. to compile variants in parallel processes first)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    variants = {"tree": persistent, **{v.split("=", 1)[0]: load_variant(v.split("=", 1)[1]) for v in a.variant}}
    if a.only:
        variants = {a.only: variants[a.only]}
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for size in a.sizes.split(","):
        res[size] = run_size(size, variants, [int(b) for b in a.batches.split(",")])
    print(json.dumps({k: v for k, v in res.items()}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
