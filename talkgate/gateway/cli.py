"""The `talkgate` command: one add_parser function per subcommand, registered in SUBCOMMANDS.

Each add_parser(subparsers) adds its subcommand and sets `func`, which takes the parsed arguments
and returns the exit status. Errors a user can fix (a bad checkpoint, an unknown voice, a busy port,
...) print one line `talkgate: error: ...` and exit with status 2, checked before a model loads
wherever they can be. Heavy modules (torch, aiohttp) are imported by the subcommands, not here:
`talkgate --help` answers at once.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from talkgate import __version__
from talkgate.gateway import args as cli_args
from talkgate.gateway import serve, warmup
from talkgate.gateway.args import CommandError

# shared/reference/qwen3-tts.md: the published checkpoints' languages (synth.checkpoint.LANGUAGES writes the
# same); a checkpoint's own config.json is what `synthesize` checks against
LANGUAGES = "auto, chinese, english, german, italian, portuguese, spanish, japanese, korean, french, russian"


def add_checkpoint_parser(subparsers) -> None:
    p = subparsers.add_parser("checkpoint", help="checkpoint tools",
                              description="Checkpoint tools. `talkgate checkpoint create --help` for the one there is.")
    sub = p.add_subparsers(dest="checkpoint_command", required=True, metavar="COMMAND")
    c = sub.add_parser(
        "create", help="write a random-weight checkpoint in the official layout",
        description="Write a deterministic random-weight checkpoint in the official Qwen3-TTS 12 Hz layout "
                    "(config.json, safetensors, tokenizer, speech_tokenizer/), marked untrained: it loads and runs "
                    "like a published one, but its audio is noise, not speech.")
    c.add_argument("out", metavar="DIR", help="output directory (created; must not exist or be empty)")
    c.add_argument("--preset", choices=["tiny", "mini", "0.6b", "1.7b"], default="mini",
                   help="model shape: tiny (the tests' size, 39 MB), mini (what `talkgate serve` runs without "
                   "--model, 82 MB; faster than real time on a CPU core), 0.6b or 1.7b (the published shapes in "
                   "bfloat16, gigabytes: for GPU benchmarks)")
    c.add_argument("--variant", choices=["custom_voice", "base", "voice_design"], default="custom_voice",
                   help="model type: custom_voice (named voices: ryan, serena, ...), base (the voice-clone model; "
                   "talkgate speaks it without a speaker), voice_design (a voice described by --instructions)")
    c.add_argument("--seed", metavar="N", type=int, default=0,
                   help="random seed of the weights: the same seed writes the same files")
    c.set_defaults(func=run_checkpoint_create)


def run_checkpoint_create(args: argparse.Namespace) -> int:
    from talkgate.synth.checkpoint import create_checkpoint

    t = time.perf_counter()
    try:
        out = create_checkpoint(args.out, preset=args.preset, variant=args.variant, seed=args.seed)
    except OSError as e:
        raise CommandError(f"{e.filename or args.out}: {e.strerror}") from None
    print(f"wrote {out} ({args.preset}, {args.variant}, seed {args.seed}, untrained random weights) "
          f"in {time.perf_counter() - t:.1f} s")
    return 0


def add_synthesize_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "synthesize", help="synthesize a text to a WAV file (offline, one utterance)",
        description="Synthesize one text to a WAV file, offline (no server). An untrained (random-weight) "
                    "checkpoint's utterance ends where the text-length rule puts it (--untrained-length); "
                    "--max-frames caps any utterance (12.5 frames a second).")
    p.add_argument("--model", metavar="DIR|ID", required=True, help="checkpoint directory or Hugging Face id")
    p.add_argument("--text", metavar="TEXT", required=True, help="the text to speak")
    p.add_argument("-o", "--output", metavar="FILE", required=True,
                   help="WAV file to write (16-bit PCM, 24 kHz mono)")
    p.add_argument("--voice", metavar="NAME",
                   help="speaker name of a custom_voice model (default: the model's first speaker)")
    p.add_argument("--ref-audio", metavar="FILE", help="clone the voice of this 1-30 s recording (Base "
                   "checkpoints; WAV, FLAC, Ogg, MP3: whatever libsndfile reads)")
    p.add_argument("--ref-text", metavar="TEXT", help="what is said in --ref-audio: clones in context (ICL) instead "
                   "of from the speaker embedding alone")
    p.add_argument("--language", metavar="NAME", default="auto", help=f"one of the model's languages: {LANGUAGES}")
    p.add_argument("--instructions", metavar="TEXT",
                   help="voice description (voice_design) or style instruction (1.7B custom_voice)")
    p.add_argument("--greedy", action="store_true", help="argmax instead of sampling")
    p.add_argument("--seed", metavar="N", type=cli_args.seed, help="sampling seed (default: a fresh random one)")
    p.add_argument("--max-frames", metavar="N", type=cli_args.integer(1), help="stop after this many 80 ms frames "
                   "(default: the checkpoint's generation_config max_new_tokens: 8192, 11 minutes, for talkgate's "
                   "checkpoints; an untrained checkpoint's text-length rule stops it sooner)")
    serve.add_untrained_length(p)
    p.add_argument("--device", metavar="DEVICE", type=cli_args.device, default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="Talker and code predictor dtype (default: bfloat16 on GPU, float32 on CPU)")
    p.set_defaults(func=run_synthesize)


def print_model_info(info) -> None:
    import json
    print("model: " + json.dumps(info.as_dict()), file=sys.stderr)
    if info.untrained:
        print("NOTICE: untrained random weights: the audio is noise, not speech", file=sys.stderr)


def check_output(path: Path) -> None:
    """A file can be written at `path` (so that synthesis is not wasted on a path that fails at the end)."""
    folder = path.parent
    if path.is_dir():
        raise CommandError(f"-o {path}: is a directory; give a file name")
    if not folder.is_dir():
        raise CommandError(f"-o {path}: no such directory {folder}")
    if not os.access(folder, os.W_OK):
        raise CommandError(f"-o {path}: cannot write in {folder} (permission denied)")


def check_request(model: str, voice: str | None, language: str, instructions: str | None) -> None:
    """Voice, language and instructions as the engine will check them, from the checkpoint's config
    and tokenizer alone (no weights read)."""
    from talkgate.synth.api import ContextParams
    from talkgate.synth.loader import read_config, resolve_path
    from talkgate.synth.prompt import Prompts
    from talkgate.synth.tokenizer import QwenTokenizer

    root = resolve_path(model)
    try:
        tokenizer = QwenTokenizer.from_dir(root)
    except ValueError:
        return              # the load reports it, naming the file
    Prompts(read_config(root), tokenizer, talker=None, predictor=None).resolve(
        ContextParams(voice=voice, language=language, instructions=instructions))


def run_synthesize(args: argparse.Namespace) -> int:
    output = Path(args.output)
    check_output(output)
    if not args.text.strip():
        raise CommandError("--text is empty")
    if args.ref_text is not None and args.ref_audio is None:
        raise CommandError("--ref-text needs --ref-audio")
    if args.ref_audio is not None and not Path(args.ref_audio).is_file():
        raise CommandError(f"--ref-audio {args.ref_audio}: no such file")
    device = cli_args.check_device(args.device)
    check_request(args.model, args.voice, args.language, args.instructions)

    import numpy as np
    import torch

    from talkgate.codecs.pcm import s16le_bytes
    from talkgate.codecs.wav import wav_header
    from talkgate.synth.api import InvalidParams, SamplingParams
    from talkgate.synth.loader import load_tts
    from talkgate.synth.offline import synthesize

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float32 if device == "cpu" else torch.bfloat16)
    tts = load_tts(args.model, device=device, dtype=dtype, untrained_length=args.untrained_length)
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
    with open(output, "wb") as f:
        f.write(wav_header(sr, len(wav)))
        f.write(s16le_bytes(np.asarray(wav, dtype=np.float32)))
    seconds = len(wav) / sr
    print(f"wrote {output}: {seconds:.2f} s of audio in {elapsed:.2f} s"
          + (f" (real-time factor {elapsed / seconds:.2f})" if seconds else ""), file=sys.stderr)
    return 0


def add_bench_parser(subparsers) -> None:
    # listed for --help only: main() hands `bench` its arguments untouched (bench/load.py parses them)
    subparsers.add_parser("bench", add_help=False,
                          help="end-to-end load test of a running server (`talkgate bench --help`)")


def run_bench(argv: list[str]) -> int:
    from talkgate.bench import load
    return load.main(argv)


SUBCOMMANDS = [add_checkpoint_parser, add_synthesize_parser, serve.add_parser, warmup.add_parser, add_bench_parser]


def parser() -> argparse.ArgumentParser:
    p = cli_args.Parser(prog="talkgate", description="talkgate: real-time streaming text-to-speech gateway "
                        "(Qwen3-TTS). `talkgate COMMAND --help` for each command's options.")
    p.add_argument("--version", action="version", version=f"talkgate {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in SUBCOMMANDS:
        add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return run_bench(argv[1:])
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except CommandError as e:
        print(f"talkgate: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from talkgate.synth.api import EngineError
        from talkgate.synth.checkpoint import CheckpointWriteError
        from talkgate.synth.loader import CheckpointError
        if not isinstance(e, (CheckpointError, CheckpointWriteError, EngineError)):
            raise
        print(f"talkgate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
