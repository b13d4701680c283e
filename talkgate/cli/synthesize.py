"""`talkgate synthesize`: one text to a WAV file, offline (no server)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from talkgate.cli import args as cli_args
from talkgate.cli import serve
from talkgate.cli.args import CommandError

# shared/reference/qwen3-tts.md: the published checkpoints' languages (synth.checkpoint.LANGUAGES writes the
# same); a checkpoint's own config.json is what `synthesize` checks against
LANGUAGES = "auto, chinese, english, german, italian, portuguese, spanish, japanese, korean, french, russian"


def add_parser(subparsers) -> None:
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
    p.set_defaults(func=run)


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


def run(args: argparse.Namespace) -> int:
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
