"""talkgate's Talker + code predictor against the official reference at real sizes, on a GPU.

Usage: python bench/parity_gpu.py --preset 0.6b --dtypes bfloat16,float32 --frames 64 [--device cuda]

Writes a random-weight checkpoint with `talkgate checkpoint create`'s writer, loads it into the
reference (qwen_tts, strict: every tensor name must match) and into talkgate, then compares
  - the first step's logits (Talker prefill logits over 3072, code predictor frame-0 logits),
  - greedy decoding for N frames: frames whose 16 codes are identical, and the first that differs.
Random weights never sample eos: the reference gets eos_token_id 3071 (suppressed), talkgate
ignore_eos=True. Prints one JSON line per run. Needs qwen_tts importable (tests/reference.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # the repository root: tests.reference

TEXT = ("Talkgate streams speech while the text is still arriving; this sentence is long enough "
        "to keep the text tokens coming for a while.")


def reference_model(ckpt: Path, device, dtype):
    from safetensors.torch import load_file
    from tests.reference import ref

    config = json.loads((ckpt / "config.json").read_text())
    config.pop("talkgate")
    config["talker_config"]["pad_token_id"] = None             # the reference needs it given (None is fine)
    config["talker_config"]["code_predictor_config"]["pad_token_id"] = None
    cfg = ref.Qwen3TTSConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        model = ref.Qwen3TTSForConditionalGeneration(cfg)
    state = {}
    for file in sorted(ckpt.glob("model*.safetensors")):
        state.update(load_file(str(file), device=str(device)))
    state = {k: v.to(dtype) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise SystemExit(f"reference load: missing {missing[:5]}, unexpected {unexpected[:5]}")
    # non-persistent buffers (RoPE inverse frequencies) are left on meta: the reference recomputes them
    for module in model.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf.is_meta:
                module.register_buffer(name, torch.zeros(buf.shape, dtype=buf.dtype, device=device), persistent=False)
    return model.to(device).eval()


def compare(args, ckpt: Path, dtype_name: str) -> dict:
    from talkgate.synth.api import SamplingParams
    from talkgate.synth.loader import load_tts
    from talkgate.synth.offline import generate_codes
    from tests.test_parity_talker import reference_run

    device, dtype = torch.device(args.device), getattr(torch, dtype_name)
    tts = load_tts(ckpt, device=device, dtype=dtype, with_decoder=False)
    model = reference_model(ckpt, device, dtype)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    ref_codes, ref_logits = reference_run(model, tts, TEXT, "ryan", "english", None, args.frames)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t_ref = time.perf_counter() - t
    logits = []
    t = time.perf_counter()
    codes = generate_codes(tts, TEXT, voice="ryan", language="english", sampling=SamplingParams(greedy=True),
                           max_frames=args.frames, ignore_eos=True, logits=logits)
    t_ours = time.perf_counter() - t
    same = (codes == ref_codes.cpu()).all(1)
    first_diff = int((~same).nonzero()[0]) if not same.all() else None
    talker0 = (logits[0][0] - ref_logits[0][0].float().cpu()).abs()
    pred0 = (logits[0][1] - ref_logits[0][1].float().cpu()).abs()
    return {"preset": args.preset, "dtype": dtype_name, "device": torch.cuda.get_device_name() if device.type == "cuda"
            else "cpu", "torch": torch.__version__, "frames": args.frames,
            "first_step_talker_logits_max_abs_err": round(float(talker0.max()), 6),
            "first_step_talker_logits_scale": round(float(ref_logits[0][0].float().abs().max()), 4),
            "first_frame_predictor_logits_max_abs_err": round(float(pred0.max()), 6),
            "identical_frames": int(same.sum()), "first_differing_frame": first_diff,
            "codebook0_identical": int((codes[:, 0] == ref_codes[:, 0].cpu()).sum()),
            "reference_ms_per_frame": round(1000 * t_ref / args.frames, 1),
            "talkgate_eager_ms_per_frame": round(1000 * t_ours / args.frames, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="0.6b", choices=["tiny", "mini", "0.6b", "1.7b"])
    p.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated: bfloat16, float32")
    p.add_argument("--frames", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    from talkgate.synth.checkpoint import create_checkpoint

    t = time.perf_counter()
    ckpt = create_checkpoint(Path(tempfile.mkdtemp(prefix="talkgate-parity-")) / args.preset, preset=args.preset,
                             variant="custom_voice", seed=args.seed)
    print(json.dumps({"preset": args.preset, "checkpoint_write_s": round(time.perf_counter() - t, 1)}), flush=True)
    for dtype_name in args.dtypes.split(","):
        with torch.inference_mode():
            print(json.dumps(compare(args, ckpt, dtype_name)), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
