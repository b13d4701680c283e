"""The `talkgate` command: one add_parser function per subcommand, registered in SUBCOMMANDS.

Each add_parser(subparsers) adds its subcommand and sets `func`, which takes the parsed arguments
and returns the exit status. Errors a user can fix (bad checkpoint, unknown voice, ...) print one
line `talkgate: error: ...` and exit with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from talkgate.gateway import serve, warmup


def add_checkpoint_parser(subparsers) -> None:
    p = subparsers.add_parser("checkpoint", help="checkpoint tools")
    sub = p.add_subparsers(dest="checkpoint_command", required=True)
    c = sub.add_parser("create", help="write a deterministic random-weight checkpoint in the official layout",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    c.add_argument("out", help="output directory (must not exist or be empty)")
    c.add_argument("--preset", choices=["tiny", "mini", "0.6b", "1.7b"], default="mini")
    c.add_argument("--variant", choices=["custom_voice", "base", "voice_design"], default="custom_voice")
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=run_checkpoint_create)


def run_checkpoint_create(args: argparse.Namespace) -> int:
    from talkgate.synth.checkpoint import create_checkpoint

    t = time.perf_counter()
    out = create_checkpoint(args.out, preset=args.preset, variant=args.variant, seed=args.seed)
    print(f"wrote {out} ({args.preset}, {args.variant}, seed {args.seed}, untrained random weights) "
          f"in {time.perf_counter() - t:.1f} s")
    return 0


def add_synthesize_parser(subparsers) -> None:
    p = subparsers.add_parser("synthesize", help="synthesize a text to a WAV file (offline, one utterance)",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory or Hugging Face id")
    p.add_argument("--text", required=True)
    p.add_argument("-o", "--output", required=True, help="WAV file to write (16-bit PCM, 24 kHz)")
    p.add_argument("--voice", help="speaker name (CustomVoice; default: the model's first speaker)")
    p.add_argument("--ref-audio", help="clone the voice of this 1-30 s recording (Base checkpoints; WAV, FLAC, "
                   "Ogg, MP3: whatever libsndfile reads)")
    p.add_argument("--ref-text", help="what is said in --ref-audio: clones in context (ICL) instead of from the "
                   "speaker embedding alone")
    p.add_argument("--language", default="auto")
    p.add_argument("--instructions", help="voice description (VoiceDesign) or style instruction")
    p.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    p.add_argument("--seed", type=serve.seed_arg, help="sampling seed (default: random)")
    p.add_argument("--max-frames", type=int, help="at most this many 80 ms frames "
                   "(default: generation_config max_new_tokens; untrained checkpoints: the text-length rule's)")
    serve.add_untrained_length(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="Talker and code predictor dtype (default: bfloat16 on GPU, float32 on CPU)")
    p.set_defaults(func=run_synthesize)


def print_model_info(info) -> None:
    print("model: " + json.dumps(info.as_dict()), file=sys.stderr)
    if info.untrained:
        print("NOTICE: untrained random weights: the audio is noise, not speech", file=sys.stderr)


def run_synthesize(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from talkgate.codecs.pcm import s16le_bytes
    from talkgate.codecs.wav import wav_header
    from talkgate.synth.api import InvalidParams, SamplingParams
    from talkgate.synth.loader import load_tts
    from talkgate.synth.offline import synthesize

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float32 if args.device == "cpu" else torch.bfloat16)
    if args.ref_text is not None and args.ref_audio is None:
        raise InvalidParams("--ref-text needs --ref-audio")
    tts = load_tts(args.model, device=args.device, dtype=dtype, untrained_length=args.untrained_length)
    print_model_info(tts.info)
    voice_prompt = None
    if args.ref_audio is not None:
        import soundfile

        from talkgate.synth.voice import make_voice_prompt
        try:
            audio, rate = soundfile.read(args.ref_audio, dtype="float32", always_2d=False)
        except (OSError, RuntimeError, soundfile.LibsndfileError) as e:
            raise InvalidParams(f"{args.ref_audio}: cannot read audio ({e})") from None
        t = time.perf_counter()
        voice_prompt = make_voice_prompt(tts, audio, rate, args.ref_text)
        print(f"cloned voice from {args.ref_audio} ({len(audio) / rate:.2f} s, "
              + (f"ICL, {voice_prompt.frames} reference frames" if voice_prompt.icl else "x-vector only")
              + f") in {time.perf_counter() - t:.2f} s", file=sys.stderr)
    t = time.perf_counter()
    wav, sr = synthesize(tts, args.text, voice=args.voice, language=args.language, instructions=args.instructions,
                         sampling=SamplingParams(greedy=args.greedy, seed=args.seed), max_frames=args.max_frames,
                         voice_prompt=voice_prompt)
    elapsed = time.perf_counter() - t
    with open(args.output, "wb") as f:
        f.write(wav_header(sr, len(wav)))
        f.write(s16le_bytes(np.asarray(wav, dtype=np.float32)))
    seconds = len(wav) / sr
    print(f"wrote {args.output}: {seconds:.2f} s of audio in {elapsed:.2f} s"
          + (f" (real-time factor {elapsed / seconds:.2f})" if seconds else ""), file=sys.stderr)
    return 0


def add_bench_parser(subparsers) -> None:
    # listed for --help only: main() hands `bench` its arguments untouched (bench/load.py parses them)
    subparsers.add_parser("bench", add_help=False,
                          help="end-to-end load test of a running server (bench/load.py; `talkgate bench --help`)")


def run_bench(argv: list[str]) -> int:
    from talkgate.bench import load
    return load.main(argv)


SUBCOMMANDS = [add_checkpoint_parser, add_synthesize_parser, serve.add_parser, warmup.add_parser, add_bench_parser]


def main(argv: list[str] | None = None) -> int:
    from talkgate.synth.api import EngineError
    from talkgate.synth.checkpoint import CheckpointWriteError
    from talkgate.synth.loader import CheckpointError

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return run_bench(argv[1:])
    parser = argparse.ArgumentParser(prog="talkgate", description="real-time streaming TTS gateway (Qwen3-TTS)")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser in SUBCOMMANDS:
        add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CheckpointError, CheckpointWriteError, EngineError) as e:
        print(f"talkgate: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
