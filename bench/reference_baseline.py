"""The official Qwen3-TTS reference (PyPI qwen-tts-compat) on the load generator's own texts, so that
talkgate's figures and the reference's are measured in the same run, not quoted.

    python -m bench.reference_baseline --size 0.6b --tokenizer /tmp/ck-0.6b --texts 2 --out results/ref-06b.json

--tokenizer: a checkpoint directory (`talkgate checkpoint create`), for its text tokenizer files. Random
weights at real sizes (build() below); bf16 LM, fp32 decoder; sampling on; each text runs for
frames_for_text(text) frames (random weights never sample eos). The reference's generate is not streaming,
so its first audio is the whole generate + decode; the `chunk25_est_ms` column estimates a 25-frame chunked
stream (prefill + 24 frames + decode of 25).
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import sys
import time
import types
from pathlib import Path


def _unused(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)

    def call(*args, **kwargs):
        raise RuntimeError(f"{attr}: not installed here (stood in for by bench/reference_baseline.py)")
    return call


def _stub(*names: str) -> None:
    """Modules the reference imports at load time but never uses on this path (audio I/O, mel),
    stood in for where they are not installed."""
    if importlib.util.find_spec(names[0]) is not None:
        return
    for name in names:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__path__ = []
        mod.__getattr__ = _unused                        # `from librosa.filters import mel` and the like
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, mod)


_stub("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")
_stub("librosa", "librosa.filters")
_stub("sox")

import torch  # noqa: E402


def build(size: str, device: str):
    import transformers  # noqa: F401
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2DecoderConfig
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder

    cp = dict(vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
              num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
              num_code_groups=16, max_position_embeddings=65536, pad_token_id=None)
    talker = dict(vocab_size=3072, hidden_size=1024 if size == "0.6b" else 2048,
                  intermediate_size=3072 if size == "0.6b" else 6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
                  rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
                  text_vocab_size=151936, text_hidden_size=2048, num_code_groups=16,
                  codec_bos_id=2149, codec_eos_token_id=2150, codec_pad_id=2148, codec_think_id=2154,
                  codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
                  codec_language_id={"english": 2050, "chinese": 2055}, spk_id={"ryan": 3061},
                  spk_is_dialect={"ryan": False}, max_position_embeddings=32768, pad_token_id=None,
                  code_predictor_config=cp)
    cfg = Qwen3TTSConfig(talker_config=talker, tts_model_type="custom_voice",
                         tts_model_size="0b6" if size == "0.6b" else "1b7",
                         im_start_token_id=151644, im_end_token_id=151645, tts_pad_token_id=151671,
                         tts_bos_token_id=151672, tts_eos_token_id=151673)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = Qwen3TTSForConditionalGeneration(cfg).to(device, dtype).eval()
    decoder = Qwen3TTSTokenizerV2Decoder(Qwen3TTSTokenizerV2DecoderConfig(codebook_dim=512)).to(device).eval()
    return model, decoder, cfg


def main(argv=None) -> int:
    from talkgate.loadgen.prompts import select     # the load generator's texts
    from talkgate.synth.request import frames_for_text
    from talkgate.synth.tokenizer import QwenTokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["0.6b", "1.7b"], default="0.6b")
    ap.add_argument("--tokenizer", required=True, help="a checkpoint directory holding the text tokenizer files")
    ap.add_argument("--texts", type=int, default=2, help="texts per bucket (short, medium), English")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    tok = QwenTokenizer.from_dir(args.tokenizer)
    model, decoder, cfg = build(args.size, args.device)
    never = cfg.talker_config.vocab_size - 1     # a suppressed id as eos: fixed-length runs
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    def generate(ids, frames):
        sync()
        t = time.perf_counter()
        codes, _ = model.generate(input_ids=[ids], languages=["english"], speakers=["ryan"],
                                  max_new_tokens=frames, eos_token_id=never, do_sample=True,
                                  subtalker_dosample=True, repetition_penalty=1.05)
        sync()
        return codes[0], time.perf_counter() - t

    def decode(codes):
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            wav = decoder.chunked_decode(codes.T.unsqueeze(0).clamp(0, 2047))
        sync()
        return wav, time.perf_counter() - t

    rows = []
    picked = [p for b in ("short", "medium") for p in select("en", b)[:args.texts]]
    warm = torch.tensor([[151644, 77091, 198, 1000, 151645, 198, 151644, 77091, 198]], device=args.device)
    generate(warm, 4)                                 # first-use costs stay out of the figures
    decode(generate(warm, 4)[0])
    for p in picked:
        text = p["text"]
        ids = torch.tensor([[151644, 77091, 198] + tok.encode(text) + [151645, 198, 151644, 77091, 198]],
                           device=args.device)
        frames = frames_for_text(text)
        codes, t_gen = generate(ids, frames)
        wav, t_dec = decode(codes)
        _, t_first = generate(ids, 2)
        with torch.no_grad():
            sync()
            t = time.perf_counter()
            decoder(codes.T.unsqueeze(0).clamp(0, 2047)[..., :25])
            sync()
            t_dec25 = time.perf_counter() - t
        audio_s = wav.shape[-1] / 24000
        rows.append({"bucket": p["bucket"], "chars": len(text), "frames": frames, "audio_s": round(audio_s, 2),
                     "ms_per_frame": round(1000 * t_gen / frames, 1), "rtf": round((t_gen + t_dec) / audio_s, 3),
                     "first_audio_ms": round(1000 * (t_gen + t_dec), 1),
                     "chunk25_est_ms": round(1000 * (t_first + 24 * t_gen / frames + t_dec25), 1)})
        print(json.dumps(rows[-1]), flush=True)
    result = {"size": args.size, "device": args.device, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "runs": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
