"""`talkgate checkpoint create`: a deterministic random-weight checkpoint in the official layout."""
from __future__ import annotations

import argparse
import time

from talkgate.cli.args import CommandError


def add_parser(subparsers) -> None:
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
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from talkgate.synth.checkpoint import create_checkpoint

    t = time.perf_counter()
    try:
        out = create_checkpoint(args.out, preset=args.preset, variant=args.variant, seed=args.seed)
    except OSError as e:
        raise CommandError(f"{e.filename or args.out}: {e.strerror}") from None
    print(f"wrote {out} ({args.preset}, {args.variant}, seed {args.seed}, untrained random weights) "
          f"in {time.perf_counter() - t:.1f} s")
    return 0
