"""talkgate's Talker + code predictor (and, for Base, voice cloning) against the official reference at real
sizes, on a GPU.

Usage: python -m bench.parity_gpu --preset 0.6b --dtypes bfloat16,float32 --frames 64 [--device cuda]
       python -m bench.parity_gpu --variant base --preset 1.7b --dtypes bfloat16,float32 --frames 64

Writes a random-weight checkpoint with `talkgate checkpoint create`'s writer, loads it into the
reference (qwen_tts, strict: every tensor name must match) and into talkgate, then compares
  - the first step's logits (Talker prefill logits over 3072, code predictor frame-0 logits),
  - greedy decoding for N frames: frames whose 16 codes are identical, and the first that differs.
Random weights never sample eos: the reference gets eos_token_id 3071 (suppressed), talkgate
ignore_eos=True. Prints one JSON line per run. Needs qwen_tts importable (tests/reference.py).

--variant base writes a Base checkpoint (speaker encoder, speech tokenizer with its encoder; the reference's
tokenizer loads that directory and must find every tensor it expects), clones a synthetic 10 s voice
(24 kHz, and 16 kHz for the resampling) through each side's public path (create_voice_clone_prompt /
synth.voice.make_voice_prompt) and reports: speaker embedding max abs error and scale, reference codes
identical (frames of 125), x-vector and ICL greedy generation as above, and the time each side takes to
make the voice prompt (the speech tokenizer runs in float32 on both sides, the speaker encoder in the
run's dtype, as the reference runs it with its model).
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
    from tests.parity.test_parity_talker import reference_run

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


def reference_wrapper(ckpt: Path, model, device):
    """The reference's Qwen3TTSModel around a loaded model, its speech tokenizer in float32 on the device."""
    from transformers import AutoTokenizer
    from tests.reference import load_reference_tokenizer, ref

    model.load_speech_tokenizer(load_reference_tokenizer(ckpt / "speech_tokenizer", dtype=torch.float32,
                                                         device_map=str(device)))
    processor = ref.Processor(tokenizer=AutoTokenizer.from_pretrained(str(ckpt), fix_mistral_regex=True))
    return ref.TTSModel(model, processor, {})


def timed(fn, device, reps: int = 3):
    """(result, median ms) of reps calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - t))
    return out, round(sorted(times)[len(times) // 2], 1)


def compare_clone(args, ckpt: Path, dtype_name: str) -> list[dict]:
    from safetensors.torch import load_file

    from talkgate.synth.api import SamplingParams
    from talkgate.synth.loader import load_tts
    from talkgate.synth.offline import generate_codes
    from talkgate.synth.voice import make_voice_prompt
    from tests.parity.test_parity_clone import reference_generate
    from tests.voicetools import voiced

    device, dtype = torch.device(args.device), getattr(torch, dtype_name)
    tts = load_tts(ckpt, device=device, dtype=dtype, with_decoder=False)
    wrapper = reference_wrapper(ckpt, reference_model(ckpt, device, dtype), device)
    state = wrapper.model.speech_tokenizer.model.state_dict()
    weights = load_file(str(ckpt / "speech_tokenizer" / "model.safetensors"))
    if set(state) != set(weights):
        raise SystemExit(f"reference tokenizer load: missing {sorted(set(weights) - set(state))[:5]}, "
                         f"unexpected {sorted(set(state) - set(weights))[:5]}")
    head = {"preset": args.preset, "variant": "base", "dtype": dtype_name, "device": torch.cuda.get_device_name()
            if device.type == "cuda" else "cpu", "torch": torch.__version__, "frames": args.frames}
    rows = []
    for rate in (24000, 16000):
        audio, ref_text = voiced(11, 10.0, rate), "A ten second reference recording of a synthetic voice."
        item, ref_ms = timed(lambda: wrapper.create_voice_clone_prompt((audio, rate), ref_text=ref_text)[0], device)
        vp, ours_ms = timed(lambda: make_voice_prompt(tts, audio, rate, ref_text), device)
        _, ours_xvec_ms = timed(lambda: make_voice_prompt(tts, audio, rate), device)
        want = item.ref_spk_embedding.float().cpu()
        got = torch.from_numpy(vp.embedding_array().copy())
        codes_equal = (torch.from_numpy(vp.codes_array()) == item.ref_code.cpu()).all(1)
        rows.append({**head, "check": "voice_prompt", "rate": rate,
                     "embedding_max_abs_err": round(float((got - want).abs().max()), 6),
                     "embedding_scale": round(float(want.abs().max()), 4),
                     "reference_frames": int(item.ref_code.shape[0]), "identical_code_frames": int(codes_equal.sum()),
                     "reference_prompt_ms": ref_ms, "talkgate_prompt_ms": ours_ms,
                     "talkgate_xvector_prompt_ms": ours_xvec_ms})
    for mode in ("xvector", "icl"):
        item = wrapper.create_voice_clone_prompt((audio, rate), ref_text=ref_text if mode == "icl" else None,
                                                 x_vector_only_mode=mode == "xvector")[0]
        vp = make_voice_prompt(tts, audio, rate, ref_text if mode == "icl" else None)
        t = time.perf_counter()
        ref_codes, ref_logits = reference_generate(wrapper, TEXT, "english", item, args.frames)
        t_ref = time.perf_counter() - t
        logits = []
        codes = generate_codes(tts, TEXT, language="english", voice_prompt=vp, sampling=SamplingParams(greedy=True),
                               max_frames=args.frames, ignore_eos=True, logits=logits)
        same = (codes == ref_codes.cpu()).all(1)
        rows.append({**head, "check": f"generate_{mode}",
                     "first_step_talker_logits_max_abs_err":
                         round(float((logits[0][0] - ref_logits[0][0].float().cpu()).abs().max()), 6),
                     "first_frame_predictor_logits_max_abs_err":
                         round(float((logits[0][1] - ref_logits[0][1].float().cpu()).abs().max()), 6),
                     "identical_frames": int(same.sum()),
                     "first_differing_frame": int((~same).nonzero()[0]) if not same.all() else None,
                     "codebook0_identical": int((codes[:, 0] == ref_codes[:, 0].cpu()).sum()),
                     "reference_ms_per_frame": round(1000 * t_ref / args.frames, 1)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="0.6b", choices=["tiny", "mini", "0.6b", "1.7b"])
    p.add_argument("--variant", default="custom_voice", choices=["custom_voice", "base"])
    p.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated: bfloat16, float32")
    p.add_argument("--frames", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    from talkgate.synth.checkpoint import create_checkpoint

    t = time.perf_counter()
    ckpt = create_checkpoint(Path(tempfile.mkdtemp(prefix="talkgate-parity-")) / args.preset, preset=args.preset,
                             variant=args.variant, seed=args.seed)
    print(json.dumps({"preset": args.preset, "variant": args.variant,
                      "checkpoint_write_s": round(time.perf_counter() - t, 1)}), flush=True)
    for dtype_name in args.dtypes.split(","):
        with torch.inference_mode():
            for row in (compare_clone(args, ckpt, dtype_name) if args.variant == "base"
                        else [compare(args, ckpt, dtype_name)]):
                print(json.dumps(row), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
